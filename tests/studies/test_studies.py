"""The recorded studies on real data (studies/<name>/sweep.py): their runs and settings."""

import glob
import json
import os

import pytest

from train import sweep

STUDIES = sorted(glob.glob('studies/*/sweep.py'))
REAL_DATA_FIELDS = {'dataset.source', 'dataset.data_dir', 'dataset.holdout', 'dataset.eval_split'}


def test_every_study_has_its_sweep_and_readme():
  assert [os.path.dirname(p) for p in STUDIES] == [
    'studies/bytelm',
    'studies/cifar10_mechanisms',
    'studies/imdb_bytes',
    'studies/lora_mnist',
    'studies/mnist_pixels',
    'studies/mnist_projections',
    'studies/recall',
  ]
  for path in STUDIES:
    assert os.path.exists(os.path.join(os.path.dirname(path), 'README.md')), path


def _recorded():
  with open(
    os.path.join(os.path.dirname(os.path.dirname(__file__)), "recorded_study_runs.json")
  ) as f:
    return [
      (path, case['arg'], case['runs'])
      for path, cases in sorted(json.load(f).items())
      for case in cases
    ]


@pytest.mark.parametrize('path,arg,recorded', _recorded())
def test_key_value_settings_give_the_recorded_runs(path, arg, recorded):
  """The same runs (names, configs, overrides) as the environment-variable settings the
  studies were recorded with, so their workdirs resume: recorded_study_runs.json holds the
  old sweeps' expansion (e.g. SEED=1 for `:seed=1`)."""
  runs = sweep.expand(sweep.load_sweep(f'{path}:{arg}' if arg else path), '/root')
  assert [[r.name, r.config, dict(r.overrides)] for r in runs] == recorded


@pytest.mark.parametrize(
  'path',
  [
    'studies/mnist_projections/sweep.py',
    'studies/cifar10_mechanisms/sweep.py',
    'studies/imdb_bytes/sweep.py',
  ],
)
def test_real_data_comparisons_change_only_the_data_and_the_budget(path):
  """The real-data studies run the shipped configs: only the data's location and train.* move."""
  runs = sweep.expand(sweep.load_sweep(path))
  assert len(runs) >= 3
  configs = sweep.check(runs)
  for run in runs:
    moved = {k for k in run.overrides if k not in REAL_DATA_FIELDS and not k.startswith('train.')}
    assert not moved, (run.name, moved)
    assert configs[run.name].dataset.source == 'arrays'
    assert configs[run.name].dataset.eval_split == 'validation'


def test_the_mnist_projection_study_splits_by_scheme_seed_and_budget():
  """schemes, seeds and epochs pick a piece of studies/mnist_projections to run."""
  path = 'studies/mnist_projections/sweep.py'
  names = [r.name for r in sweep.expand(sweep.load_sweep(path))]
  assert len(names) == 8 and len(set(names)) == 8
  runs = sweep.expand(sweep.load_sweep(f'{path}:schemes=standard,super,seeds=1,epochs=25'))
  assert [r.config for r in runs] == ['configs/mnist.py:standard', 'configs/mnist.py:super']
  assert all(r.overrides['train.seed'] == 1 and r.overrides['train.num_epochs'] == 25 for r in runs)
  # An empty list is named, never the config's bare default (standard) run silently.
  with pytest.raises(sweep.SweepError, match=r"^sweep file .*schemes= names nothing"):
    sweep.load_sweep(f'{path}:schemes=')
  with pytest.raises(sweep.SweepError, match=r"^sweep file .*seeds='x' is not a valid int$"):
    sweep.load_sweep(f'{path}:seeds=0,x')
  with pytest.raises(sweep.SweepError, match=r'seeds=-2 is not valid; it must be >= 0$'):
    sweep.load_sweep(f'{path}:seeds=1,-2')
  with pytest.raises(sweep.SweepError, match=r'epochs=0 is not valid; it must be >= 1$'):
    sweep.load_sweep(f'{path}:epochs=0')


@pytest.mark.parametrize(
  'path',
  [
    'studies/cifar10_mechanisms/sweep.py',
    'studies/imdb_bytes/sweep.py',
    'studies/mnist_pixels/sweep.py',
    'studies/lora_mnist/sweep.py',
  ],
)
def test_the_mechanism_studies_take_a_seed(path):
  """seed=1 runs a second seed of a study (the default stays the recorded seed 0)."""
  assert all(r.overrides['train.seed'] == 0 for r in sweep.expand(sweep.load_sweep(path)))
  runs = sweep.expand(sweep.load_sweep(f'{path}:seed=1'))
  assert runs and all(r.overrides['train.seed'] == 1 for r in runs)
  with pytest.raises(sweep.SweepError, match=r"^sweep file .*seed='one' is not a valid int$"):
    sweep.load_sweep(f'{path}:seed=one')  # named, not "invalid literal for int()"
  with pytest.raises(sweep.SweepError, match=r'seed=-1 is not valid; it must be >= 0$'):
    sweep.load_sweep(f'{path}:seed=-1')
  with pytest.raises(sweep.SweepError, match=r"unknown key 'SEED'; valid keys: seed, .*data_dir$"):
    sweep.load_sweep(f'{path}:SEED=1')

"""--mode=eval evaluates a run on its own dataset, read from the run's config.json.

A run trained from an .npz file with a held-out validation split
(`dataset.source=arrays`, `holdout`, `eval_split=validation`) is evaluated by its
training command plus --mode=eval (the same default workdir) and by
`--config=<file> --workdir=<run> --mode=eval` alone (the dataset from config.json,
not the config file's default: a TFDS download, for a CIFAR-10 config).
"""

import json
import os
import subprocess
import sys

import main_runner
import numpy as np
import pytest

from configs import default
from train import cli
from train import trainer
from train import workdir as workdir_lib

ROOT = main_runner.ROOT
CONFIG = f'--config={ROOT}/configs/default.py'


def _run(cwd, *args):
  """main.py in `cwd` (its default workdirs go to cwd/runs/): (stdout lines, stderr)."""
  kwargs = dict(main_runner.popen_kwargs(), cwd=str(cwd))
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, 'main.py'), *args], timeout=300, **kwargs
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout.splitlines(), proc.stderr


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(folder, training flags, workdir, results): two steps of the default digits ViT on an
  .npz file of 60 8x8 images with 20% held out, trained with main.py in `folder`."""
  folder = tmp_path_factory.mktemp('eval_stored')
  rng = np.random.default_rng(0)
  np.savez(
    folder / 'digits_train.npz',
    x=rng.integers(0, 256, (60, 8, 8), dtype=np.uint8),
    y=np.repeat(np.arange(10), 6),
  )
  flags = [
    CONFIG,
    '--config.dataset.source=arrays',
    f'--config.dataset.data_dir={folder / "digits_train.npz"}',
    '--config.dataset.holdout=0.2',
    '--config.dataset.eval_split=validation',
    '--config.dataset.batch_size=16',
    '--config.dataset.eval_batch_size=12',
    '--config.train.num_epochs=-1',
    '--config.train.num_steps=2',
  ]
  lines, _ = _run(folder, *flags)
  workdir = lines[0].removeprefix('workdir ')
  with open(folder / workdir / 'results.json') as f:
    results = json.load(f)
  assert results['eval_split'] == 'validation' and results['steps'] == 2
  return folder, flags, workdir, results


def _evaluated(folder, workdir):
  with open(folder / workdir / 'eval_results.json') as f:
    return json.load(f)


def test_training_command_plus_mode_eval_evaluates_its_run(trained):
  """It went to another workdir (holdout kept in the eval hash, the other overrides
  dropped) and said there were no checkpoints."""
  folder, flags, workdir, results = trained
  lines, _ = _run(folder, *flags, '--mode=eval')
  assert lines[0] == f'workdir {workdir}'
  values = _evaluated(folder, workdir)
  assert values['split'] == 'validation' and values['step'] == 2
  assert values['loss'] == pytest.approx(results['eval_loss'], rel=1e-5)


def test_mode_eval_with_only_the_workdir_reads_the_stored_dataset(trained):
  """The config file's own dataset (scikit-learn's digits, no holdout) was used: the
  run was refused as another config's; for a TFDS config, a download came first."""
  folder, _, workdir, results = trained
  (folder / workdir / 'eval_results.json').unlink(missing_ok=True)
  lines, _ = _run(folder, CONFIG, f'--workdir={workdir}', '--mode=eval')
  assert lines[0] == f'workdir {workdir}'
  values = _evaluated(folder, workdir)
  assert values['split'] == 'validation'
  assert values['loss'] == pytest.approx(results['eval_loss'], rel=1e-5)


def test_an_override_of_the_command_wins_over_the_stored_dataset(trained):
  """`--config.dataset.eval_split=train` evaluates the run's training split (the 48
  examples left after the holdout), everything else from config.json."""
  folder, _, workdir, _ = trained
  path = str(folder / workdir)
  config = default.get_config()
  config.dataset.eval_split = 'train'  # as --config.dataset.eval_split=train sets it
  config = cli.eval_config(config, workdir_lib.load_config(path), {'dataset.eval_split': 'train'})
  assert config.dataset.source == 'arrays' and config.dataset.holdout == 0.2
  assert config.dataset.eval_split == 'train'
  values = trainer.evaluate(config, path)
  assert np.isfinite(values['loss'])
  assert _evaluated(folder, workdir)['split'] == 'train'


def test_eval_config_without_a_stored_config_is_the_command_config():
  config = default.get_config()
  assert cli.eval_config(config, None, {}) is config


def test_eval_workdir_finds_the_run_of_the_training_command():
  """The first workdir that holds a run: all the overrides (the training command's),
  then fewer of those an evaluation may change; else the workdir without them."""
  overrides = {
    'dataset.source': 'arrays',
    'dataset.holdout': 0.1,
    'dataset.eval_split': 'validation',
    'model.depth': 3,
  }
  trained_with_all = workdir_lib.default_workdir('configs/cifar10_nystrom.py', overrides)
  assert (
    workdir_lib.eval_workdir(
      'configs/cifar10_nystrom.py', overrides, lambda p: p == trained_with_all
    )
    == trained_with_all
  )
  # trained without the eval split, evaluated with it
  without_split = workdir_lib.default_workdir(
    'configs/cifar10_nystrom.py', {k: v for k, v in overrides.items() if k != 'dataset.eval_split'}
  )
  assert (
    workdir_lib.eval_workdir('configs/cifar10_nystrom.py', overrides, lambda p: p == without_split)
    == without_split
  )
  # no run: the workdir of the overrides an evaluation may not change, as before
  assert workdir_lib.eval_workdir('configs/cifar10_nystrom.py', overrides, lambda p: False) == (
    workdir_lib.default_workdir('configs/cifar10_nystrom.py', overrides, evaluating=True)
  )
  assert workdir_lib.eval_workdir('configs/default.py', None, lambda p: False) == 'runs/default'


@pytest.mark.slow
def test_mode_eval_on_a_damaged_config_json_is_one_line(tmp_path):
  """An evaluation reads the run's config.json before anything else: an empty one (left by
  an interrupted write) is one line pointing to --restart, not a traceback."""
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'config.json').write_text('')
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, 'main.py'),
      '--config=configs/default.py',
      f'--workdir={run}',
      '--mode=eval',
    ],
    timeout=300,
    **main_runner.popen_kwargs(),
  )
  assert proc.returncode == 1, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('Error: ') and 'is damaged (empty)' in last and '--restart' in last
  assert 'Traceback' not in proc.stderr

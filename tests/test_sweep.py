"""Sweep expansion, naming, skipping and pod commands (no training here)."""
import glob
import json
import os
import sys

import pytest

from efficient_attn import registry
from train import sweep


def test_grid_expands_to_named_runs():
  runs = sweep.expand(dict(config='configs/mnist.py',
                           grid={'attention.projection': ['standard', 'super'],
                                 'model.num_heads': [1, 4]},
                           fixed={'train.num_steps': 10}))
  assert [r.name for r in runs] == [
      'projection=standard.num_heads=1', 'projection=standard.num_heads=4',
      'projection=super.num_heads=1', 'projection=super.num_heads=4']
  assert runs[3].overrides == {'train.num_steps': 10, 'attention.projection': 'super',
                               'model.num_heads': 4}


def test_configs_in_grid_and_explicit_runs():
  runs = sweep.expand(dict(grid={'config': ['configs/mnist.py:super', 'configs/cifar10.py:linear']},
                           runs=[]))
  assert [r.name for r in runs] == ['mnist-super', 'cifar10-linear']
  runs = sweep.expand(dict(runs=[{'name': 'base', 'config': 'configs/lora_base.py:digits'},
                                 {'config': 'configs/lora_finetune.py:rotated,4,base={root}/base',
                                  'name': 'ft'}]), root='/r')
  assert [r.name for r in runs] == ['base', 'ft']
  assert runs[1].config == 'configs/lora_finetune.py:rotated,4,base=/r/base'
  runs = sweep.expand(dict(config='configs/default.py',
                           runs=[{'attention.mechanism': 'linear'},
                                 {'attention.mechanism': 'local', 'attention.options.window': 8}]))
  assert [r.name for r in runs] == ['mechanism=linear', 'mechanism=local.window=8']


def test_bad_sweeps_fail_clearly(tmp_path):
  with pytest.raises(sweep.SweepError, match=r"unknown sweep keys \['gird'\]"):
    sweep.expand(dict(config='c.py', gird={}))
  with pytest.raises(sweep.SweepError, match="needs 'config'"):
    sweep.expand(dict(grid={'a': [1, 2]}))
  with pytest.raises(sweep.SweepError, match='nope.py.*does not exist'):
    sweep.load_sweep(str(tmp_path / 'nope.py'))
  (tmp_path / 'typo.py').write_text('def get_sweep():\n  return dict(confg=1)\n')
  with pytest.raises(sweep.SweepError, match=r"unknown sweep keys \['confg'\]"):
    sweep.expand(sweep.load_sweep(str(tmp_path / 'typo.py')))
  (tmp_path / 'broken.py').write_text('def get_sweep(:\n')
  with pytest.raises(sweep.SweepError, match='does not load: SyntaxError'):
    sweep.load_sweep(str(tmp_path / 'broken.py'))
  runs = sweep.expand(dict(config='configs/default.py',
                           runs=[{'model.num_heads': 3}, {'model.num_head': 4},
                                 {'attention.mechanism': 'nystrm'}, {'model.depth': 1}]))
  with pytest.raises(sweep.SweepError) as e:  # every bad run named, up front
    sweep.check(runs)
  message = str(e.value)
  assert message.startswith('3 of 4 runs are not valid')
  assert 'num_heads=3' in message and 'num_head' in message and 'nystrm' in message


def test_command_status_and_skip(tmp_path, capsys):
  runs = sweep.expand(dict(config='configs/default.py', grid={'train.seed': [0, 1]}))
  cmd = sweep.command(runs[0], str(tmp_path), python='python3')
  assert cmd == ['python3', 'main.py', '--config=configs/default.py',
                 f'--workdir={tmp_path}/seed=0', '--config.train.seed=0']
  assert sweep.status(runs[0], str(tmp_path)) == 'new'
  configs = sweep.check(runs)
  for run in runs:  # both finished with these configs: nothing is launched
    os.makedirs(tmp_path / run.name)
    (tmp_path / run.name / 'config.json').write_text(configs[run.name].to_json())
    (tmp_path / run.name / 'results.json').write_text(json.dumps({}))
  assert sweep.run_local(runs, str(tmp_path), configs, python='/nonexistent/python') == {
      'seed=0': 'skipped', 'seed=1': 'skipped'}
  # The sweep's fixed values changed: its runs are not 'done', and are not touched.
  changed = sweep.expand(dict(config='configs/default.py', grid={'train.seed': [0, 1]},
                              fixed={'model.depth': 1}))
  new_configs = sweep.check(changed)
  assert sweep.status(changed[0], str(tmp_path), new_configs['seed=0']) == 'changed'
  assert sweep.run_local(changed, str(tmp_path), new_configs,
                         python='/nonexistent/python')['seed=0'] == 'failed (changed config)'
  os.remove(tmp_path / 'seed=1' / 'results.json')
  assert sweep.status(runs[1], str(tmp_path), configs['seed=1']) == 'partial'
  # A run that exits cleanly without results (stopped by SIGTERM) is resumable, not failed.
  assert sweep.run_local(runs, str(tmp_path), configs, python='true')['seed=1'] == sweep.STOPPED
  # A run whose process fails is reported, and the sweep goes on.
  out = sweep.run_local(runs, str(tmp_path), configs, python=sys.executable + '-missing')
  assert out['seed=1'].startswith('failed')


def test_pod_commands_start_every_worker():
  runs = sweep.expand(dict(config='configs/cifar10_nystrom.py', grid={'model.num_heads': [4, 8]}))
  cmds = sweep.pod_commands(runs, '/mnt/shared/sweep', 'v4-32', 'us-central2-b')
  assert len(cmds) == 2
  assert cmds[0].startswith('gcloud compute tpus tpu-vm ssh v4-32 --zone=us-central2-b --worker=all')
  assert '--workdir=/mnt/shared/sweep/num_heads=4' in cmds[0]


@pytest.mark.parametrize('path', sorted(glob.glob('sweeps/*.py') + glob.glob('sweeps/*/*.py')))
def test_shipped_sweeps_expand_to_existing_configs(path):
  runs = sweep.expand(sweep.load_sweep(path))
  assert runs
  for run in runs:
    assert os.path.exists(run.config.split(':')[0]), run.config


REAL_DATA_FIELDS = {'dataset.source', 'dataset.data_dir', 'dataset.holdout', 'dataset.eval_split'}


@pytest.mark.parametrize('path', ['sweeps/real/mnist_projections.py',
                                  'sweeps/real/cifar10_mechanisms.py',
                                  'sweeps/real/imdb_bytes.py'])
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


def test_the_mnist_projection_study_splits_by_scheme_seed_and_budget(monkeypatch):
  """SCHEMES, SEEDS and EPOCHS pick a piece of sweeps/real/mnist_projections.py to run."""
  path = 'sweeps/real/mnist_projections.py'
  names = [r.name for r in sweep.expand(sweep.load_sweep(path))]
  assert len(names) == 8 and len(set(names)) == 8
  monkeypatch.setenv('SCHEMES', '')   # empty means all four, never the config's bare default
  assert [r.name for r in sweep.expand(sweep.load_sweep(path))] == names
  monkeypatch.setenv('SCHEMES', 'standard,super')
  monkeypatch.setenv('SEEDS', '1')
  monkeypatch.setenv('EPOCHS', '25')
  runs = sweep.expand(sweep.load_sweep(path))
  assert [r.config for r in runs] == ['configs/mnist.py:standard', 'configs/mnist.py:super']
  assert all(r.overrides['train.seed'] == 1 and r.overrides['train.num_epochs'] == 25
             for r in runs)


def test_the_cifar10_sweep_runs_exactly_what_its_config_files_run():
  """Each run of sweeps/cifar10_mechanisms.py is configs/cifar10.py:<mechanism>, options included."""
  from configs import cifar10  # pylint: disable=g-import-not-at-top
  from train import validate  # pylint: disable=g-import-not-at-top
  runs = sweep.expand(sweep.load_sweep('sweeps/cifar10_mechanisms.py'))
  configs = sweep.check(runs)
  assert {r.name for r in runs} == {f'cifar10-{m}' for m in registry.list_mechanisms()}
  for run in runs:
    mechanism = run.config.split(':')[1]
    direct = validate.resolved(cifar10.get_config(mechanism), read_data=False)
    assert configs[run.name].to_dict() == direct.to_dict(), run.name
    assert dict(direct.attention.options) == dict(registry.get_mechanism(mechanism).resolve())


def test_the_lra_sweep_reads_its_environment(monkeypatch):
  """sweeps/lra.py: SIZE picks the configs' size, TASKS the tasks, AAN_DIR Retrieval's files."""
  monkeypatch.setenv('SIZE', 'small')
  names = {r.name for r in sweep.expand(sweep.load_sweep('sweeps/lra.py'))}
  assert names == {f'{t}-{m}' for t in ('listops', 'pathfinder')
                   for m in registry.list_mechanisms()}
  monkeypatch.setenv('TASKS', 'retrieval')
  monkeypatch.setenv('MECHANISMS', 'linear,nystrom')
  monkeypatch.setenv('AAN_DIR', 'gs://bucket/tsv_data')
  runs = sweep.expand(sweep.load_sweep('sweeps/lra.py'))
  assert [r.config for r in runs] == ['configs/lra/retrieval.py:linear,size=small',
                                      'configs/lra/retrieval.py:nystrom,size=small']
  assert all(r.overrides['dataset.data_dir'] == 'gs://bucket/tsv_data' for r in runs)


@pytest.mark.parametrize('path', ['sweeps/real/cifar10_mechanisms.py',
                                  'sweeps/real/imdb_bytes.py', 'sweeps/real/mnist_pixels.py',
                                  'sweeps/real/lora_mnist.py'])
def test_the_mechanism_studies_take_a_seed(path, monkeypatch):
  """SEED runs a second seed of studies 2 to 5 (the default stays the recorded seed 0)."""
  assert all(r.overrides['train.seed'] == 0 for r in sweep.expand(sweep.load_sweep(path)))
  monkeypatch.setenv('SEED', '1')
  runs = sweep.expand(sweep.load_sweep(path))
  assert runs and all(r.overrides['train.seed'] == 1 for r in runs)
  monkeypatch.setenv('SEED', 'one')  # named, not "invalid literal for int()"
  with pytest.raises(sweep.SweepError, match=r"does not load: ValueError: SEED='one' is not an "
                                             r'integer'):
    sweep.load_sweep(path)

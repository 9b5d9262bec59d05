"""Sweep expansion, naming, skipping and pod commands (no training here)."""
import json
import os
import sys

import pytest

from train import sweep


def test_grid_expands_to_named_runs():
  runs = sweep.expand(dict(config='configs/mnist_standard.py',
                           grid={'attention.projection': ['standard', 'super'],
                                 'model.num_heads': [1, 4]},
                           fixed={'train.num_steps': 10}))
  assert [r.name for r in runs] == [
      'projection=standard.num_heads=1', 'projection=standard.num_heads=4',
      'projection=super.num_heads=1', 'projection=super.num_heads=4']
  assert runs[3].overrides == {'train.num_steps': 10, 'attention.projection': 'super',
                               'model.num_heads': 4}


def test_configs_in_grid_and_explicit_runs():
  runs = sweep.expand(dict(grid={'config': ['configs/mnist_super.py', 'configs/cifar10_linear.py']},
                           runs=[]))
  assert [r.name for r in runs] == ['mnist_super', 'cifar10_linear']
  runs = sweep.expand(dict(config='configs/default.py',
                           runs=[{'attention.mechanism': 'linear'},
                                 {'attention.mechanism': 'local', 'attention.options.window': 8}]))
  assert [r.name for r in runs] == ['mechanism=linear', 'mechanism=local.window=8']


def test_bad_sweeps_fail_clearly(tmp_path):
  with pytest.raises(ValueError, match=r"unknown sweep keys \['gird'\]"):
    sweep.expand(dict(config='c.py', gird={}))
  with pytest.raises(ValueError, match="needs 'config'"):
    sweep.expand(dict(grid={'a': [1, 2]}))
  with pytest.raises(FileNotFoundError, match='nope.py'):
    sweep.load_sweep(str(tmp_path / 'nope.py'))


def test_command_status_and_skip(tmp_path, capsys):
  runs = sweep.expand(dict(config='configs/default.py', grid={'train.seed': [0, 1]}))
  cmd = sweep.command(runs[0], str(tmp_path), python='python3')
  assert cmd == ['python3', 'main.py', '--config=configs/default.py',
                 f'--workdir={tmp_path}/seed=0', '--config.train.seed=0']
  assert sweep.status(runs[0], str(tmp_path)) == 'new'
  for run in runs:  # both finished: nothing is launched
    os.makedirs(tmp_path / run.name)
    (tmp_path / run.name / 'results.json').write_text(json.dumps({}))
  assert sweep.run_local(runs, str(tmp_path), python='/nonexistent/python') == {
      'seed=0': 'skipped', 'seed=1': 'skipped'}
  os.remove(tmp_path / 'seed=1' / 'results.json')
  assert sweep.status(runs[1], str(tmp_path)) == 'partial'
  # A run whose process fails is reported, and the sweep goes on.
  out = sweep.run_local(runs, str(tmp_path), python=sys.executable + '-missing')
  assert out['seed=1'].startswith('failed')


def test_pod_commands_start_every_worker():
  runs = sweep.expand(dict(config='configs/cifar10_nystrom.py', grid={'model.num_heads': [4, 8]}))
  cmds = sweep.pod_commands(runs, '/mnt/shared/sweep', 'v4-32', 'us-central2-b')
  assert len(cmds) == 2
  assert cmds[0].startswith('gcloud compute tpus tpu-vm ssh v4-32 --zone=us-central2-b --worker=all')
  assert '--workdir=/mnt/shared/sweep/num_heads=4' in cmds[0]


@pytest.mark.parametrize('path', sorted(
    os.path.join('sweeps', f) for f in os.listdir('sweeps') if f.endswith('.py')))
def test_shipped_sweeps_expand_to_existing_configs(path):
  runs = sweep.expand(sweep.load_sweep(path))
  assert runs
  for run in runs:
    assert os.path.exists(run.config.split(':')[0]), run.config

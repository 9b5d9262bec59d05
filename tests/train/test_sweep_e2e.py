"""A sweep end to end: `python -m train.sweep ... run` trains, skips, resumes; report.

Also parses every shipped sweep's commands as main.py would and validates the
resulting configs, so a sweep that cannot start fails here, not on a pod.
"""

import glob
import json
import os
import subprocess
import sys

from absl import flags
import main_runner
from ml_collections import config_flags
import pytest

from train import sweep

TINY_SWEEP = '''
def get_sweep():
  return dict(
      config='configs/default.py',
      grid={'attention.mechanism': ['softmax', 'linear']},
      fixed={'train.num_epochs': -1, 'train.num_steps': 5, 'train.log_every': 5,
             'model.depth': 1, 'dataset.batch_size': 16},
  )
'''
RUNS = ('mechanism=softmax', 'mechanism=linear')


def sweep_cli(*args):
  proc = subprocess.run(
    [sys.executable, '-m', 'train.sweep', *args], timeout=300, **main_runner.popen_kwargs()
  )
  return proc


def results(root, name):
  with open(os.path.join(root, name, 'results.json')) as f:
    return json.load(f)


@pytest.mark.slow
def test_sweep_runs_skips_resumes_and_reports(tmp_path):
  definition = tmp_path / 'tiny.py'
  definition.write_text(TINY_SWEEP)
  root = str(tmp_path / 'root')
  args = [f'--sweep={definition}', f'--root={root}', 'run']

  proc = sweep_cli(*args)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert '2/2 runs finished' in proc.stdout
  for name in RUNS:
    r = results(root, name)
    assert r['steps'] == 5 and r['depth'] == 1 and r['resumed_from_step'] == 0
    assert r['mechanism'] == name.split('=')[1]
  finished = {n: os.path.getmtime(os.path.join(root, n, 'results.json')) for n in RUNS}

  proc = sweep_cli(*args)  # nothing left to do
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.count('finished before, skipped') == 2, proc.stdout
  assert finished == {n: os.path.getmtime(os.path.join(root, n, 'results.json')) for n in RUNS}

  os.remove(os.path.join(root, 'mechanism=linear', 'results.json'))  # as if cut short
  proc = sweep_cli(*args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert '[1/2] mechanism=softmax: finished before, skipped' in proc.stdout
  assert '[2/2] mechanism=linear: resuming' in proc.stdout
  assert results(root, 'mechanism=linear')['resumed_from_step'] == 5

  out = str(tmp_path / 'report')
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'benchmarks.report',
      *sorted(glob.glob(os.path.join(root, '*'))),
      f'--out={out}',
      '--name=tiny',
      '--quiet',
    ],
    timeout=300,
    **main_runner.popen_kwargs(),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(out, 'tiny.json')) as f:
    rows = json.load(f)['runs']
  assert sorted(r['run'] for r in rows) == sorted(RUNS)
  assert all(r['status'] == 'finished' and r['steps'] == 5 for r in rows)


def parse_main_flags(cmd):
  """The config main.py would build from the command line `cmd`."""
  argv = ['main.py', *cmd[2:]]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values, sys_argv=argv)
  flags.DEFINE_string('workdir', None, '', flag_values=values)
  values(argv)
  return values.config


@pytest.mark.parametrize(
  'path',
  sorted(
    glob.glob(os.path.join(main_runner.ROOT, 'sweeps', '*.py'))
    + glob.glob(os.path.join(main_runner.ROOT, 'studies', '*', 'sweep.py'))
  ),
  ids=lambda p: os.path.relpath(p, main_runner.ROOT),
)
def test_shipped_sweep_commands_give_valid_configs(path, monkeypatch):
  """Each run's main.py command parses to a config the validator accepts (as `list` checks)."""
  monkeypatch.chdir(main_runner.ROOT)
  runs = sweep.expand(sweep.load_sweep(path), root='/tmp/sweep')
  configs = sweep.check(runs, root='/tmp/sweep')
  for run in runs:  # the command line gives the config that was checked
    config = parse_main_flags(sweep.command(run, '/tmp/sweep'))
    assert config.attention.mechanism == configs[run.name].attention.mechanism

"""Sweeps sharing a root, and usage errors (issue 59, item 9).

Two `train.sweep ... run` on one root each trained every run once, but the one whose
trainer lost a workdir's lock reported that run failed and exited 1; a usage error
printed the whole help (38 lines) before its one line.
"""

import json
import os
import socket
import subprocess
import sys
import types

import main_runner

from train import sweep
from train import workdir as workdir_lib

ELSEWHERE = 'running elsewhere'  # sweep.ELSEWHERE, as the outcomes say it
SWEEP = '''
def get_sweep():
  return dict(config='configs/default.py', grid={'train.seed': [0, 1]})
'''


def seeds():
  runs = sweep.expand(dict(config='configs/default.py', grid={'train.seed': [0, 1]}))
  return runs, sweep.check(runs)


def lock(folder, pid):
  """`folder`'s trainer.lock, as a trainer of process `pid` on this host writes it."""
  os.makedirs(folder, exist_ok=True)
  (folder / workdir_lib.LOCK).write_text(json.dumps({'pid': pid, 'host': socket.gethostname()}))


class Trainer:
  """A run's process: `act(workdir)` when waited for, then exits with `rc`."""

  def __init__(self, act, rc):
    self.act, self.rc = act, rc

  def __call__(self, cmd):
    workdir = next(a.split('=', 1)[1] for a in cmd if a.startswith('--workdir='))
    self.act(workdir)
    return types.SimpleNamespace(wait=lambda: self.rc)


def test_a_run_another_trainer_holds_is_running_elsewhere_not_started(tmp_path, capsys):
  runs, configs = seeds()
  lock(tmp_path / 'seed=0', os.getpid())  # a live process of this host holds it
  lock(tmp_path / 'seed=1', 2**22 + 12345)  # a stale lock (no such process): started
  out = sweep.run_local(runs, str(tmp_path), configs, python=sys.executable + '-missing')
  assert out['seed=0'] == ELSEWHERE
  assert out['seed=1'].startswith('failed')
  assert (
    f'[1/2] seed=0: running elsewhere (pid {os.getpid()} on {socket.gethostname()} '
    'trains it); skipped'
  ) in capsys.readouterr().out


def test_a_trainer_refused_the_lock_is_running_elsewhere_not_failed(tmp_path, monkeypatch):
  """Both sweeps started the run at once: the other's trainer took the lock, this one's
  exited 1 ('... is in use by another trainer')."""
  runs, configs = seeds()
  monkeypatch.setattr(
    sweep.subprocess,
    'Popen',
    Trainer(lambda workdir: lock(tmp_path / os.path.basename(workdir), os.getpid()), rc=1),
  )
  out = sweep.run_local(runs, str(tmp_path), configs)
  assert out == {'seed=0': ELSEWHERE, 'seed=1': ELSEWHERE}


def test_a_run_the_other_trainer_finished_meanwhile_is_done(tmp_path, monkeypatch):
  runs, configs = seeds()

  def finished(workdir):  # the other trainer finished and let go before this one exited
    (tmp_path / os.path.basename(workdir)).mkdir()
    name = os.path.basename(workdir)
    (tmp_path / name / 'config.json').write_text(configs[name].to_json())
    (tmp_path / name / 'results.json').write_text(json.dumps({}))

  monkeypatch.setattr(sweep.subprocess, 'Popen', Trainer(finished, rc=1))
  assert sweep.run_local(runs, str(tmp_path), configs) == {'seed=0': 'done', 'seed=1': 'done'}
  monkeypatch.setattr(sweep.subprocess, 'Popen', Trainer(lambda workdir: None, rc=1))
  out = sweep.run_local(runs, str(tmp_path / 'other'), configs)
  assert out == {'seed=0': 'failed (rc=1)', 'seed=1': 'failed (rc=1)'}  # a failure still is


def test_the_sweep_exits_0_when_only_runs_elsewhere_are_left(tmp_path, monkeypatch, capsys):
  definition = tmp_path / 'two.py'
  definition.write_text(SWEEP)
  monkeypatch.setattr(sweep, '_SWEEP', types.SimpleNamespace(name='sweep', value=str(definition)))
  monkeypatch.setattr(sweep, '_ROOT', types.SimpleNamespace(name='root', value=str(tmp_path)))
  monkeypatch.setattr(
    sweep, 'run_local', lambda runs, root, configs: {'seed=0': 'done', 'seed=1': ELSEWHERE}
  )
  assert sweep.main(['train.sweep', 'run']) == 0
  assert capsys.readouterr().out.splitlines()[-1] == (
    f'1/2 runs finished; results in {tmp_path}; running elsewhere (another trainer has '
    'them): seed=1'
  )
  monkeypatch.setattr(
    sweep, 'run_local', lambda runs, root, configs: {'seed=0': 'failed (rc=1)', 'seed=1': ELSEWHERE}
  )
  assert sweep.main(['train.sweep', 'run']) == 1


def test_a_usage_error_is_one_line_naming_what_was_wrong():
  proc = subprocess.run(
    [sys.executable, '-m', 'train.sweep', '--sweep=s.py', 'go'],
    timeout=300,
    **main_runner.popen_kwargs(),
  )
  assert proc.returncode == 1 and proc.stdout == ''
  assert proc.stderr.splitlines() == [
    'train.sweep: usage: python -m train.sweep --sweep=FILE[:key=value,...] --root=DIR '
    "list|run|pod; 'go' is not an action; --root missing (--help for more)"
  ]

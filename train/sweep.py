"""Expand a sweep into named runs; check them, run them here one after another, or print
pod commands.

A sweep file defines `get_sweep()`, or `get_sweep(arg)` taking settings after a ':'
like a config file (`--sweep=studies/cifar10_mechanisms/sweep.py:seed=1,epochs=25`),
returning a dict with
  * `config`: the config file (big_vision style `path[:arg]`), or several
    under `grid['config']` to sweep experiments (`configs/cifar10.py:<m>`);
  * `grid`: {override or 'config': [values]}, expanded as a Cartesian product, and/or
  * `runs`: an explicit list of {override: value} dicts (each merged over `fixed`;
    a 'config' key picks the run's config file, a 'name' key names its workdir);
  * `fixed`: overrides applied to every run (e.g. {'train.num_steps': 500}).
Overrides are `ConfigDict` paths as on the command line (`attention.mechanism`).
'{root}' in a config argument or an override value is replaced by --root (a
run can start from another run of the sweep, e.g. `init_from='{root}/base'`).

    python -m train.sweep --sweep=sweeps/mnist_projections.py --root=runs/mnist list
    python -m train.sweep --sweep=sweeps/mnist_projections.py --root=runs/mnist run
    python -m train.sweep --sweep=sweeps/mnist_projections.py --root=runs/mnist pod \
        --tpu_name=my-v4-32 --zone=us-central2-b

Every action first builds and validates each run's config exactly as main.py
would, and stops with one line per bad run. `list` shows each run's status:
'done' (results.json of the steps asked for, same config), 'partial'
(resumable, or finished with fewer steps than now asked for), 'new', or
'changed' (the workdir holds a run of another config: `run` will not touch it).
`run` skips finished runs and resumes unfinished ones (re-running the same
command restores the newest checkpoint); a failing run is reported and the
sweep goes on; a stop (Ctrl-C or SIGTERM to the sweep, or the run's own SIGTERM)
lets the running run save its checkpoint and starts no other. `pod` prints, for each run,
the one command that starts it on every worker of a TPU VM pod.

Several `run`s may share a root (on one machine, or several over a shared folder):
a run whose workdir another trainer holds (its trainer.lock names a live process)
is not started but reported 'running elsewhere', as is one whose trainer was
refused that lock; they do not count as failed.

A usage error (no action, a flag missing or unknown) is one line on stderr, e.g.
"train.sweep: usage: python -m train.sweep --sweep=FILE[:key=value,...] --root=DIR
list|run|pod; no action given (--help for more)".
"""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from absl import app
from absl import flags
from etils import epath

from train import session as session_lib
from train import validate
from train import workdir as workdir_lib
from train.sweep_runs import Run  # noqa: F401 (re-exported)
from train.sweep_runs import SweepError  # noqa: F401 (re-exported)
from train.sweep_runs import build_config  # noqa: F401 (re-exported)
from train.sweep_runs import command  # noqa: F401 (re-exported)
from train.sweep_runs import expand  # noqa: F401 (re-exported)
from train.sweep_runs import flag_args  # noqa: F401 (re-exported)
from train.sweep_runs import load_sweep  # noqa: F401 (re-exported)
from train.sweep_runs import run_name  # noqa: F401 (re-exported)
from train.sweep_runs import workdir_of  # noqa: F401 (re-exported)

_SWEEP = flags.DEFINE_string(
  'sweep',
  None,
  'Sweep definition file (defines get_sweep()), settings after a colon: path.py:key=value,...',
)
_ROOT = flags.DEFINE_string('root', None, 'Folder holding one workdir per run.')
_TPU = flags.DEFINE_string('tpu_name', 'TPU_NAME', 'pod: the TPU VM name.')
_ZONE = flags.DEFINE_string('zone', 'ZONE', 'pod: the TPU VM zone.')
_REPO = flags.DEFINE_string('repo_dir', '~/efficient-attn', 'pod: the repository on the VM.')
ACTIONS = ('list', 'run', 'pod')
STOPPED = 'stopped (resumable)'
NOT_STARTED = 'not started (sweep stopped)'
ELSEWHERE = 'running elsewhere'  # another trainer holds the run's workdir (not a failure)
USAGE = 'python -m train.sweep --sweep=FILE[:key=value,...] --root=DIR list|run|pod'


def check(runs: Sequence[Run], root: str = '', here: bool = False) -> Dict[str, Any]:
  """{name: config} after validating every run; SweepError lists every bad one.

  A run that starts from another run of the sweep (`init_from` in `root`) is
  checked without that workdir, which exists only once the other run is done.
  `here`: the runs will run on this machine (`list`, `run`), so each is also built as
  the trainer builds it (`session.Session`, without reading data): its mesh on these
  devices, the batch split over it, the sequence split, and what the library refuses
  when the model is traced.
  """
  configs, errors, bad = {}, [], 0
  ours = {os.path.normpath(workdir_of(r, root)) for r in runs}
  for run in runs:
    try:
      config = build_config(run)
      init_from = config.get('init_from', '')
      if init_from and os.path.normpath(init_from) in ours:
        config.init_from = ''
      config = validate.resolved(config, read_data=False)
      if here:
        session_lib.Session(config, read_data=False)
      config.init_from = init_from
      configs[run.name] = config
    except (SweepError, validate.ConfigError) as e:
      bad += 1
      errors += [
        f'  {run.name}: {line}'.replace(f"run {run.name!r}: ", '') for line in str(e).splitlines()
      ]
  if errors:
    raise SweepError(f'{bad} of {len(runs)} runs are not valid:\n' + '\n'.join(errors))
  return configs


def status(run: Run, root: str, config=None) -> str:
  """'done', 'partial', 'new', or 'changed' (the workdir holds another config's run).

  With `config`, a finished run is 'done' only if it trained the steps `config`
  asks for: fewer is 'partial' (`run` continues it), more is 'changed'.
  """
  workdir = epath.Path(workdir_of(run, root))
  stored = workdir_lib.load_config(workdir)
  if stored is None:
    return 'partial' if workdir.is_dir() else 'new'
  if config is not None:
    wanted = config.to_dict()
    if not wanted.get('dataset', {}).get('num_classes') and stored.get('dataset', {}).get(
      'num_classes'
    ):
      # 0: read from the data when the run starts (the stored config holds what was read;
      # the trainer compares the two then).
      wanted['dataset']['num_classes'] = stored.dataset.num_classes
    if workdir_lib.differences(stored.to_dict(), wanted):
      return 'changed'
  if not (workdir / workdir_lib.RESULTS).exists():
    return 'partial'
  if config is None:
    return 'done'
  beyond = workdir_lib.steps_beyond(config, json.loads((workdir / workdir_lib.RESULTS).read_text()))
  return 'done' if beyond == 0 else 'partial' if beyond > 0 else 'changed'


def holder(run: Run, root: str) -> Optional[str]:
  """'pid <pid> on <host>' of the live trainer whose lock (workdir.LOCK) holds the run's
  workdir, else None (no lock, or one left by a process of this host that is gone). A
  lock that cannot be read, or names another host, counts as held (as the trainer
  counts it)."""
  file = epath.Path(workdir_of(run, root)) / workdir_lib.LOCK
  try:
    if not file.exists():
      return None
    other = json.loads(file.read_text())
    pid, host = int(other['pid']), str(other['host'])
  except FileNotFoundError:
    return None  # released as it was read
  except (OSError, ValueError, KeyError, TypeError):
    return 'a trainer its lock does not name'
  if host == socket.gethostname():
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return None
    except PermissionError:
      pass
  return f'pid {pid} on {host}'


def _wait(process: subprocess.Popen, label: str) -> int:
  """The run's exit code. On Ctrl-C (or SIGTERM to the sweep, which `_stop_on_sigterm`
  turns into a KeyboardInterrupt) the run is asked to save and exit (SIGTERM, which its
  trainer turns into a checkpoint) and is waited for, so the save is not cut short; a
  second Ctrl-C kills it. Re-raises the KeyboardInterrupt."""
  try:
    return process.wait()
  except KeyboardInterrupt:
    print(
      f'{label}: stop asked (Ctrl-C or SIGTERM): the run saves a checkpoint and stops '
      f'(Ctrl-C again: kill it)',
      flush=True,
    )
    process.send_signal(signal.SIGTERM)
    try:
      process.wait()
    except KeyboardInterrupt:
      process.kill()
      process.wait()
    raise


class _stop_on_sigterm:
  """Inside: the first SIGTERM to the sweep raises KeyboardInterrupt (Ctrl-C's path: the
  running run saves, no other starts); later ones are ignored, so a preemption that
  signals twice does not cut the save short. Outside the main thread: does nothing."""

  def __enter__(self):
    self._previous = None
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    return False


def run_local(
  runs: Sequence[Run], root: str, configs: Mapping[str, Any], python: str = sys.executable
) -> Dict[str, str]:
  """Run each unfinished run in turn; returns {name: 'done'|'skipped'|STOPPED|ELSEWHERE|
  'failed ...'}.

  A run that exits cleanly without results (SIGTERM: a checkpoint was saved) is
  STOPPED, not failed: running the sweep again resumes it. A stop ends the sweep:
  Ctrl-C or SIGTERM to the sweep (the running run saves its checkpoint first), or the
  running run stopped by a SIGTERM of its own (a preemption); the runs after it are
  NOT_STARTED. A run another trainer holds (`holder`) is ELSEWHERE: not started, or, when
  its trainer was refused the workdir, not failed.
  """
  outcome = {}
  stopped = False
  with _stop_on_sigterm():
    for i, run in enumerate(runs, 1):
      if stopped:
        outcome[run.name] = NOT_STARTED
        continue
      state = status(run, root, configs.get(run.name))
      if state in ('done', 'changed'):
        why = (
          'finished before, skipped'
          if state == 'done'
          else f'{workdir_of(run, root)} holds a run of another config; skipped'
        )
        print(f'[{i}/{len(runs)}] {run.name}: {why}', flush=True)
        outcome[run.name] = 'skipped' if state == 'done' else 'failed (changed config)'
        continue
      verb = 'resuming' if state == 'partial' else 'starting'
      label = f'[{i}/{len(runs)}] {run.name}'
      other = holder(run, root)
      if other:
        outcome[run.name] = ELSEWHERE
        print(f'{label}: {ELSEWHERE} ({other} trains it); skipped', flush=True)
        continue
      print(f'{label}: {verb}', flush=True)
      t0 = time.time()
      try:
        rc = _wait(subprocess.Popen(command(run, root, python)), label)
      except OSError as e:  # the interpreter could not be started
        print(f'{label}: could not start: {e}', flush=True)
        rc = -1
      except KeyboardInterrupt:
        stopped, rc = True, 0
      took = time.time() - t0
      after = status(run, root)
      if rc == 0 and after == 'done':
        outcome[run.name] = 'done'
      elif rc == 0 and after == 'partial':  # stopped by SIGTERM after saving a checkpoint
        outcome[run.name] = STOPPED
        stopped = True  # preempted: the sweep stops too (running it again resumes here)
      elif rc != 0 and holder(run, root):  # another trainer took the workdir's lock first
        outcome[run.name] = ELSEWHERE
      elif rc != 0 and after == 'done' and status(run, root, configs.get(run.name)) == 'done':
        outcome[run.name] = 'done'  # (refused, and the other trainer has finished it since)
      else:
        outcome[run.name] = f'failed (rc={rc})'
      print(f'{label}: {outcome[run.name]} in {took:.0f}s', flush=True)
  return outcome


def pod_commands(
  runs: Sequence[Run], root: str, tpu_name: str, zone: str, repo_dir: str = '~/efficient-attn'
) -> List[str]:
  """One `gcloud ... ssh --worker=all` command per run: every host starts the same
  program; main.py's no-argument `jax.distributed.initialize()` finds the pod."""
  out = []
  for run in runs:
    inner = ' '.join(shlex.quote(c) for c in command(run, root, python='python3'))
    remote = f'cd {repo_dir} && {inner}'
    out.append(
      f'gcloud compute tpus tpu-vm ssh {tpu_name} --zone={zone} --worker=all '
      f'--command={shlex.quote(remote)}'
    )
  return out


def usage(problem: str) -> str:
  """The one line a usage error prints: the usage, then what was wrong."""
  return f'train.sweep: usage: {USAGE}; {problem} (--help for more)'


def parse_flags(argv: Sequence[str]) -> List[str]:
  """absl's flag parsing, a bad flag in one line (absl's error, then where to find help)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(usage(str(e).strip().splitlines()[0]))


def _usage_problems(argv: Sequence[str]) -> List[str]:
  """What is wrong with the command line, if anything: the action and the flags needed."""
  problems = []
  if len(argv) < 2:
    problems.append('no action given')
  elif len(argv) > 2:
    problems.append(f'one action only, got {" ".join(argv[1:])}')
  elif argv[1] not in ACTIONS:
    problems.append(f'{argv[1]!r} is not an action')
  missing = [f'--{flag.name}' for flag in (_SWEEP, _ROOT) if not flag.value]
  if missing:
    problems.append(f'{" and ".join(missing)} missing')
  return problems


def main(argv) -> int:
  problems = _usage_problems(argv)
  if problems:
    sys.exit(usage('; '.join(problems)))
  action, root = argv[1], _ROOT.value
  try:
    runs = expand(load_sweep(_SWEEP.value), root)
    configs = check(runs, root, here=action != 'pod')
  except SweepError as e:
    sys.exit(f'Error: {e}')
  if action == 'list':
    for run in runs:
      print(f'{status(run, root, configs[run.name]):8s} {run.name}')
      print('         ' + ' '.join(shlex.quote(c) for c in command(run, root)))
    return 0
  if action == 'pod':
    print('\n'.join(pod_commands(runs, root, _TPU.value, _ZONE.value, _REPO.value)))
    return 0
  outcome = run_local(runs, root, configs)
  failed = [n for n, status in outcome.items() if status.startswith('failed')]
  stopped = [n for n, status in outcome.items() if status == STOPPED]
  waiting = [n for n, status in outcome.items() if status == NOT_STARTED]
  elsewhere = [n for n, status in outcome.items() if status == ELSEWHERE]
  print(
    f'{len(outcome) - len(failed) - len(stopped) - len(waiting) - len(elsewhere)}/'
    f'{len(outcome)} runs finished; results in {root}'
    + (f'; {ELSEWHERE} (another trainer has them): {", ".join(elsewhere)}' if elsewhere else '')
    + (f'; stopped (run the sweep again to resume): {", ".join(stopped)}' if stopped else '')
    + (f'; not started: {", ".join(waiting)}' if waiting else '')
    + (f'; failed: {", ".join(failed)}' if failed else '')
  )
  return 1 if failed else 130 if waiting else 0


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

"""A workdir's identity: the config that made it, and one trainer at a time.

    run = workdir.open_run(path, config, restart=False)   # before any other write
    ...
    run.close()

`config.json` is the workdir's identity. A config whose fields differ from the
stored ones, other than those in `MAY_CHANGE`, is refused before anything is
written: the message names the fields and says how to go on (a new workdir, or
`--restart`, which moves the old run aside, never deletes it). A lock file
keeps a second trainer out of a workdir in use; a lock left by a process that
is gone is replaced with a warning.
"""
import datetime
import json
import os
import socket
from typing import Any, Dict, List, Optional

from absl import logging
from etils import epath
import ml_collections

CONFIG = 'config.json'
RESULTS = 'results.json'
LOCK = 'trainer.lock'

# Fields that may change when a run is resumed or evaluated: they change how
# long it runs, how often it reports and where data or outputs are, not what
# model it trains.
MAY_CHANGE = (
    'train.num_steps', 'train.num_epochs', 'train.eval_every', 'train.log_every',
    'train.checkpoint_every', 'train.keep_checkpoints', 'train.async_checkpoints',
    'dataset.eval_batch_size', 'dataset.eval_split', 'dataset.data_dir',
    'dataset.manual_dir', 'dataset.download', 'sample',
)


# Fields added to the configs after runs were made, with the value that gives
# the behaviour those runs had: a stored config without the field reads as
# having it, so older workdirs can still be resumed and evaluated.
ADDED_DEFAULTS = {'model.positions': 'learned', 'dataset.num_distractors': None}


def is_local(path) -> bool:
  """Whether `path` is on this machine's filesystem (not gs://, s3://, ...)."""
  return '://' not in str(path)


class WorkdirError(ValueError):
  """The workdir holds another run, or is in use."""


def _flat(tree: Dict[str, Any], prefix: str = '') -> Dict[str, Any]:
  out = {}
  for key, value in tree.items():
    path = f'{prefix}{key}'
    if isinstance(value, dict) and value:
      out.update(_flat(value, path + '.'))
    else:
      out[path] = value
  return out


def _may_change(path: str) -> bool:
  return any(path == f or path.startswith(f + '.') for f in MAY_CHANGE)


def differences(stored: Dict[str, Any], config: Dict[str, Any]) -> List[str]:
  """'field: stored -> new' for every field (outside MAY_CHANGE) that differs; a field of
  ADDED_DEFAULTS missing from the stored config counts as its default."""
  a, b = _flat(stored), _flat(json.loads(json.dumps(config)))
  a.update({k: v for k, v in ADDED_DEFAULTS.items() if k not in a and k in b})
  keys = sorted(k for k in set(a) | set(b) if not _may_change(k))
  return [f'{k}: {a.get(k, "(absent)")!r} -> {b.get(k, "(absent)")!r}' for k in keys
          if a.get(k, '(absent)') != b.get(k, '(absent)')]


def load_config(path) -> Optional[ml_collections.ConfigDict]:
  """The config stored in a workdir, or None."""
  file = epath.Path(path) / CONFIG
  if not file.exists():
    return None
  return ml_collections.ConfigDict(json.loads(file.read_text()))


def check_identity(path, config, *, evaluating: bool = False) -> None:
  """Raises WorkdirError if `path` holds a run of another config."""
  stored = load_config(path)
  if stored is None:
    return
  diffs = differences(stored.to_dict(), config.to_dict())
  if diffs:
    shown = '; '.join(diffs[:6]) + (f'; and {len(diffs) - 6} more' if len(diffs) > 6 else '')
    if evaluating:
      raise WorkdirError(f'{path} holds a run of another config, so this config cannot '
                         f'evaluate it ({shown}); evaluate with the stored config '
                         f'({path}/{CONFIG}), changing only {", ".join(MAY_CHANGE)}')
    raise WorkdirError(
        f'{path} holds a run of another config, so this config cannot continue it ({shown}). '
        f'Use a new --workdir (add --config.init_from={path} to fork: start from its '
        f'weights), or pass --restart to move the old run aside and start over')


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class Run:
  """An open workdir: its identity checked, its lock held (on the writing process)."""

  def __init__(self, path, config, *, writer: bool):
    self.path = epath.Path(path)
    self.writer = writer
    self._lock = self.path / LOCK
    self._locked = False
    if writer:
      self.path.mkdir(parents=True, exist_ok=True)
      self._take_lock()
      (self.path / CONFIG).write_text(config.to_json_best_effort(indent=2, sort_keys=True))

  def _take_lock(self) -> None:
    me = {'pid': os.getpid(), 'host': socket.gethostname()}
    for _ in range(2):
      if not self._create_lock(me):
        try:
          other = json.loads(self._lock.read_text())
        except (OSError, ValueError):
          other = {}
        if other.get('host') == me['host'] and not _pid_alive(int(other.get('pid', -1))):
          logging.warning('Replacing a stale lock in %s (process %s is not running)',
                          self.path, other.get('pid'))
          self._lock.unlink()
          continue
        raise WorkdirError(
            f'{self.path} is in use by another trainer (pid {other.get("pid")} on '
            f'{other.get("host")}); wait for it, or, if that process is gone, delete '
            f'{self._lock}') from None
      self._locked = True
      return

  def _create_lock(self, me: Dict[str, Any]) -> bool:
    """Writes the lock file unless it exists. Atomic on a local disk; on an object
    store (gs://) it is check-then-write, which keeps out a trainer started later
    but not one started in the same instant."""
    if is_local(self._lock):
      try:
        fd = os.open(os.fspath(self._lock), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
      except FileExistsError:
        return False
      with os.fdopen(fd, 'w') as f:
        json.dump(me, f)
      return True
    if self._lock.exists():
      return False
    self._lock.write_text(json.dumps(me))
    return True

  @property
  def results(self) -> Optional[Dict[str, Any]]:
    """The finished run's results.json, or None."""
    file = self.path / RESULTS
    return json.loads(file.read_text()) if file.exists() else None

  def close(self) -> None:
    if self._locked:
      self._lock.unlink()
      self._locked = False


def write_json(path, name: str, obj) -> None:
  """Writes `path/name` as JSON (through a temporary file and a rename)."""
  tmp = epath.Path(path) / f'{name}.tmp'
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
  tmp.rename(epath.Path(path) / name)


def open_run(path, config, *, writer: bool = True, restart: bool = False) -> Run:
  """Checks the workdir's identity (or moves the old run aside), locks it, stores the config."""
  path = epath.Path(path)
  if restart and (path / CONFIG).exists():
    if writer:
      stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
      aside = path.parent / f'{path.name}.replaced-{stamp}'
      path.rename(aside)
      logging.warning('--restart: moved the previous run in %s to %s', path, aside)
  else:
    check_identity(path, config)
  return Run(path, config, writer=writer)

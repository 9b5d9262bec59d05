"""A workdir's identity: the config that made it, and one trainer at a time.

    run = workdir.open_run(path, config, restart=False)   # before any other write
    ...
    run.close()

`config.json` is the workdir's identity. A config whose fields differ from the
stored ones, other than those in `MAY_CHANGE`, is refused before anything is
written: the message names the fields and says how to go on (a new workdir, or
`--restart`, which moves the old run aside, never deletes it). A lock file
keeps a second trainer out of a workdir in use (`--restart` included); a lock
left by a process that is gone, or an empty or unreadable one (its trainer
stopped before writing it: a full disk), is replaced with a warning.

The run's length (`train.num_steps`, or `num_epochs` whole epochs) may grow on
resume, never shrink: a finished run asked for more steps continues from its
final checkpoint (its results.json kept as `results.<steps>-steps.json`), and
a workdir trained past the asked length is refused. config.json always
describes the run whose results and checkpoints the workdir holds.

Every JSON file written here is strict JSON: a non-finite float is null, and
is written whole or not at all (`write_atomic`). A write that fails (a full
disk, a read-only folder, a file where the workdir should be) is a WorkdirError
in one line naming the path; a full disk says how to go on (`disk_full_message`).
"""

import contextlib
import datetime
import errno
import json
import math
import os
import socket
import time
from typing import Any, Dict, List, Optional
import uuid

from absl import logging
from etils import epath
import ml_collections

from configs import fields
from efficient_attn.layers import hybrid

CONFIG = 'config.json'
RESULTS = 'results.json'
LOCK = 'trainer.lock'

# Fields that may change when a run is resumed or evaluated: they change how
# long it runs, how often it reports, where data or outputs are and how it is
# laid out over the devices (a checkpoint restores onto any mesh), not what
# model it trains.
MAY_CHANGE = (
  'train.num_steps',
  'train.num_epochs',
  'train.eval_every',
  'train.log_every',
  'train.checkpoint_every',
  'train.keep_checkpoints',
  'train.async_checkpoints',
  'train.mesh',
  'train.fsdp_min_size',
  'dataset.eval_batch_size',
  'dataset.eval_split',
  'dataset.data_dir',
  'dataset.source',
  'dataset.manual_dir',
  'dataset.download',
  'sample',
)


# Fields added to the configs after runs were made, with the value that gives
# the behaviour those runs had: a stored config without the field reads as
# having it, so older workdirs can still be resumed and evaluated.
ADDED_DEFAULTS = {
  'model.positions': 'learned',
  'dataset.num_distractors': None,
  # mamba2's head layout options (None: each head its own B and C, of
  # head_dim, and the norm over the full width, as before they existed)
  'attention.options.ngroups': None,
  'attention.options.d_state': None,
  # the gated family's initialisation, convolution bias, dt range and
  # kernels (0.2.0): PyTorch's initialisation, no bias (Mamba-2's default
  # is a bias now), Mamba's dt range, the XLA chunk form
  'attention.options.init': 'default',
  'attention.options.conv_bias': False,
  'attention.options.dt_min': 0.001,
  'attention.options.dt_max': 0.1,
  'attention.options.implementation': 'auto',
}

# Fields the data fills in when a run starts (`data.check_splits`), with what a change
# means: compared only where both configs have them (a config resolved without reading
# the data has none; a run stored before the field existed resumes as it did).
FROM_DATA = {
  'dataset.corpus_sha256': 'the text of dataset.corpus changed; builtin:python_docs '
  'is the running Python\'s documentation and changes '
  'with its version'
}


class WorkdirError(ValueError):
  """The workdir holds another run, or is in use, or cannot be written."""


_DISK_FULL = {errno.ENOSPC: 'no space left on device', errno.EDQUOT: 'disk quota exceeded'}


def _disk_full_reason(error) -> Optional[str]:
  if getattr(error, 'errno', None) in _DISK_FULL:
    return _DISK_FULL[error.errno]
  text = str(error).lower()  # Orbax's and TensorFlow's errors carry the OS's words
  return next((reason for reason in _DISK_FULL.values() if reason in text), None)


def is_disk_full(error) -> bool:
  """Whether `error` (an OSError, an Orbax or TensorFlow error wrapping one, or a
  message) says the disk (or the user's quota) is full."""
  return _disk_full_reason(error) is not None


def disk_full_message(error, target, workdir=None) -> str:
  """'disk full: no space left on device writing <target>; free space and re-run the same
  command to resume from step N': `workdir`, a training run's, gives the step of its newest
  checkpoint (the re-run resumes from it)."""
  then = 'free space and re-run the same command'
  if workdir is not None:
    steps = checkpoint_steps(workdir)
    then += (
      f' to resume from step {steps[-1]}'
      if steps
      else ' (no checkpoint was saved: it starts from step 0)'
    )
  return f'disk full: {_disk_full_reason(error) or "no space left"} writing {target}; {then}'


def _file_above(path) -> Optional[str]:
  """`path` or the first of its parents that is a file, not a folder (local paths)."""
  if not fields.is_local(path):
    return None
  path = os.path.abspath(os.fspath(path))
  while True:
    if os.path.lexists(path) and not os.path.isdir(path):
      return path
    parent = os.path.dirname(path)
    if parent == path:
      return None
    path = parent


def unwritable(path, error: OSError) -> str:
  """One line saying why writing in the workdir `path` failed with `error`."""
  if is_disk_full(error):
    return disk_full_message(error, error.filename or path, path)
  file = _file_above(path) if error.errno in (errno.ENOTDIR, errno.EEXIST) else None
  if file is not None:
    return (
      f'cannot use {path} as the workdir: {file} is a file, not a folder; name a '
      f'folder in --workdir'
    )
  where = f' ({error.filename})' if error.filename and str(error.filename) != str(path) else ''
  return f'cannot write in the workdir {path}: {error.strerror or error}{where}'


def write_failure(path, error: OSError, *, training: bool) -> Optional[str]:
  """main.py's one line for `error`, raised by a run in the workdir `path`, if it is a
  write that failed there: a full disk (`training`: with the step the re-run resumes
  from), or a folder it may not write; None for any other error."""
  if is_disk_full(error):
    return disk_full_message(error, error.filename or path, path if training else None)
  if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not error.filename:
    return None
  folder = os.path.abspath(os.fspath(path))
  inside = os.path.abspath(os.fspath(error.filename)).startswith(folder + os.sep)
  return unwritable(path, error) if fields.is_local(path) and inside else None


def _flat(tree: Dict[str, Any], prefix: str = '') -> Dict[str, Any]:
  out = {}
  for key, value in tree.items():
    path = f'{prefix}{key}'
    if isinstance(value, dict) and value:
      out.update(_flat(value, path + '.'))
    else:
      out[path] = value
  return out


def may_change(path: str) -> bool:
  """Whether the config field `path` ('train.num_steps') is one of MAY_CHANGE (or in one)."""
  return any(path == f or path.startswith(f + '.') for f in MAY_CHANGE)


def differences(stored: Dict[str, Any], config: Dict[str, Any]) -> List[str]:
  """'field: stored -> new' for every field (outside MAY_CHANGE) that differs; a field of
  ADDED_DEFAULTS missing from the stored config counts as its default, and one of
  FROM_DATA is compared only where both have it."""
  a, b = _flat(stored), _flat(json.loads(json.dumps(config)))
  a.update({k: v for k, v in ADDED_DEFAULTS.items() if k not in a and k in b})
  keys = sorted(
    k
    for k in set(a) | set(b)
    if not may_change(k) and not (k in FROM_DATA and (k not in a or k not in b))
  )
  return [
    f'{k}: {a.get(k, "(absent)")!r} -> {b.get(k, "(absent)")!r}'
    + (f' ({FROM_DATA[k]})' if k in FROM_DATA else '')
    for k in keys
    if a.get(k, '(absent)') != b.get(k, '(absent)')
  ]


def with_added_options(stored: Dict[str, Any]) -> Dict[str, Any]:
  """A stored config with each mechanism option of ADDED_DEFAULTS that it lacks and its
  mechanism declares, at the value the run had: so an older run is rebuilt as it trained
  (a Mamba-2 run from before `conv_bias` has no convolution bias)."""
  attention = stored.get('attention')
  if not isinstance(attention, dict) or 'options' not in attention:
    return stored
  try:
    declared = hybrid.option_defaults(attention['mechanism'])
  except (KeyError, ValueError):  # an unknown mechanism: the config's checks name it
    return stored
  prefix = 'attention.options.'
  for key, value in ADDED_DEFAULTS.items():
    name = key[len(prefix) :]
    if key.startswith(prefix) and name in declared and name not in attention['options']:
      attention['options'][name] = value
  return stored


def load_config(path) -> Optional[ml_collections.ConfigDict]:
  """The config stored in a workdir (options added since it was stored at the values the
  run had: `with_added_options`), or None."""
  file = epath.Path(path) / CONFIG
  if not file.exists():
    return None
  text = file.read_text()
  try:
    return ml_collections.ConfigDict(with_added_options(json.loads(text)))
  except ValueError as e:  # left by an older trainer's interrupted write
    why = e if text.strip() else 'empty'
    raise WorkdirError(
      f"{file}, the run's identity, is damaged ({why}); pass --restart to "
      f'move the run aside and start over'
    ) from None


def check_identity(path, config, *, evaluating: bool = False) -> None:
  """Raises WorkdirError if `path` holds a run of another config."""
  stored = load_config(path)
  if stored is None:
    return
  diffs = differences(stored.to_dict(), config.to_dict())
  if diffs:
    shown = '; '.join(diffs[:6]) + (f'; and {len(diffs) - 6} more' if len(diffs) > 6 else '')
    if evaluating:
      raise WorkdirError(
        f'{path} holds a run of another config, so this config cannot '
        f'evaluate it ({shown}); evaluate with the stored config '
        f'({path}/{CONFIG}), changing only {", ".join(MAY_CHANGE)}'
      )
    raise WorkdirError(
      f'{path} holds a run of another config, so this config cannot continue it ({shown}). '
      f'Use a new --workdir (add --config.init_from={path} to fork: start from its '
      f'weights), or pass --restart to move the old run aside and start over'
    )


def total_steps(train, steps_per_epoch: int) -> int:
  """The run's length in steps: `train.num_steps`, else `train.num_epochs` whole epochs."""
  return train.num_steps if train.num_steps > 0 else train.num_epochs * steps_per_epoch


def steps_beyond(config, results: Dict[str, Any]) -> int:
  """Steps `config` asks for beyond a finished run's results.json (< 0: it asks for fewer)."""
  if 'steps_per_epoch' not in results and config.train.num_steps <= 0:
    return 0  # an older results.json: nothing to compare with
  return total_steps(config.train, results.get('steps_per_epoch', 0)) - results['steps']


def checkpoint_steps(path) -> List[int]:
  """The steps of `path/checkpoints/<step>` folders (Orbax's temporary ones excluded)."""
  folder = epath.Path(path) / 'checkpoints'
  if not folder.is_dir():
    return []
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def _strict(obj):
  """`obj` with every non-finite float replaced by None (strict JSON has no NaN)."""
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  if isinstance(obj, dict):
    return {k: _strict(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_strict(v) for v in obj]
  return obj


def dumps(obj, **kwargs) -> str:
  """Strict JSON text of `obj`: NaN and infinities become null."""
  return json.dumps(_strict(obj), allow_nan=False, **kwargs)


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class _Lock:
  """`path/trainer.lock`: which process (pid, host) trains in the workdir."""

  def __init__(self, path):
    self.path = epath.Path(path)
    self.file = self.path / LOCK
    self.held = False
    self._me = {'pid': os.getpid(), 'host': socket.gethostname()}

  # A trainer writes its lock right after creating it: an empty or unreadable lock is
  # read again this much later before it is called stale.
  WRITE_GRACE_S = 0.5

  def acquire(self) -> None:
    """Takes the lock; WorkdirError naming the holder if a live process holds it. A stale
    lock (its process gone, on this host; or empty or unreadable) is replaced."""
    for _ in range(3):
      if self._create():
        self.held = True
        return
      other, text = self._read()
      if text is None:  # released meanwhile
        continue
      stale = self._stale(other)
      if stale is None:
        raise WorkdirError(
          f'{self.path} is in use by another trainer (pid {other.get("pid")} on '
          f'{other.get("host")}); wait for it, or, if that process is gone, delete '
          f'{self.file}'
        ) from None
      logging.warning('Replacing a stale lock in %s (%s)', self.path, stale)
      self._remove_if(text)
    raise WorkdirError(
      f'{self.path}: its lock {self.file} keeps changing (several trainers '
      f'starting at once?); try again'
    ) from None

  def _read(self):
    """(holder, text) of the lock file: holder is {} when the text is not a lock's JSON
    (after WRITE_GRACE_S, in case its trainer is writing it); (None, None) if it is gone."""
    for wait in (0.0, self.WRITE_GRACE_S):
      time.sleep(wait)
      try:
        text = self.file.read_text()
      except FileNotFoundError:
        return None, None
      try:
        other = json.loads(text)
      except ValueError:
        continue
      if isinstance(other, dict) and 'pid' in other and 'host' in other:
        return other, text
    return {}, text

  def _stale(self, other) -> Optional[str]:
    """Why the lock `other` is stale, or None if its process may be running."""
    if not other:
      return 'it is empty or unreadable: its trainer stopped before writing it'
    if other['host'] != self._me['host']:
      return None
    try:
      pid = int(other['pid'])
    except (TypeError, ValueError):
      return f'its pid {other["pid"]!r} is not a process id'
    return None if _pid_alive(pid) else f'process {pid} is not running'

  def _remove_if(self, text: str) -> None:
    """Deletes the lock file if it still holds `text` (not a lock taken meanwhile)."""
    try:
      if self.file.read_text() == text:
        self.file.unlink(missing_ok=True)
    except FileNotFoundError:
      pass

  def _create(self) -> bool:
    """Writes the lock file unless it exists. Atomic on a local disk; on an object
    store (gs://) it is check-then-write, which keeps out a trainer started later
    but not one started in the same instant."""
    if fields.is_local(self.file):
      try:
        fd = os.open(os.fspath(self.file), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
      except FileExistsError:
        return False
      try:
        with os.fdopen(fd, 'w') as f:
          json.dump(self._me, f)
      except BaseException as e:
        self.file.unlink(missing_ok=True)  # never leave an empty lock behind (a full disk)
        if isinstance(e, OSError) and e.filename is None:
          e.filename = os.fspath(self.file)
        raise
      return True
    if self.file.exists():
      return False
    self.file.write_text(json.dumps(self._me))
    return True

  def release(self) -> None:
    """Deletes the lock file if it is still this process's."""
    if not self.held:
      return
    self.held = False
    try:
      if json.loads(self.file.read_text()) != self._me:
        return
    except (OSError, ValueError):
      return
    self.file.unlink(missing_ok=True)


class Run:
  """An open workdir: its identity checked, its lock held (on the writing process).

  `finished`: the workdir holds the results of exactly the asked number of
  steps (nothing to do; config.json is left as it is).
  """

  def __init__(self, path, config, *, writer: bool, num_steps: Optional[int] = None):
    self.path = epath.Path(path)
    self.writer = writer
    self._lock = _Lock(self.path)
    if writer:
      try:
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
      except OSError as e:
        raise WorkdirError(unwritable(self.path, e)) from None
    try:
      self.finished = self._check_length(config, num_steps)
      if writer and not self.finished:
        try:
          write_json(self.path, CONFIG, json.loads(config.to_json_best_effort()))
        except OSError as e:
          raise WorkdirError(unwritable(self.path, e)) from None
    except BaseException:
      self.close()
      raise

  def _check_length(self, config, num_steps: Optional[int]) -> bool:
    """Whether the run is finished at `num_steps`; continues a shorter finished run,
    refuses a longer one (WorkdirError, nothing written)."""
    results = self.results
    if num_steps is None:
      return results is not None
    done = results['steps'] if results is not None else 0
    newest = max(checkpoint_steps(self.path), default=0)
    if max(done, newest) > num_steps:
      what = (
        f'its results.json is from step {done}'
        if done >= newest
        else f'its newest checkpoint is at step {newest}'
      )
      t = config.train
      asked = (
        f'train.num_steps={t.num_steps}'
        if t.num_steps > 0
        else f'train.num_epochs={t.num_epochs}: {num_steps} steps'
      )
      raise WorkdirError(
        f'{self.path} has trained further than this config asks ({what}; {asked}): the '
        f'length may grow on resume, not shrink. Use a new --workdir '
        f'(--config.init_from={self.path} starts from its weights), or --restart'
      )
    if results is None:
      return False
    if done == num_steps:
      return True
    if self.writer:
      kept = self.path / f'results.{done}-steps.json'
      (self.path / RESULTS).replace(kept)
      logging.warning(
        '%s finished at step %d; continuing it to step %d from its final '
        'checkpoint (its results are kept in %s)',
        self.path,
        done,
        num_steps,
        kept.name,
      )
    return False

  @property
  def results(self) -> Optional[Dict[str, Any]]:
    """The finished run's results.json, or None."""
    file = self.path / RESULTS
    return json.loads(file.read_text()) if file.exists() else None

  def close(self) -> None:
    self._lock.release()


def write_atomic(path, text: str) -> None:
  """Writes the file `path` whole or not at all: `text` goes to a temporary file beside it
  (`<name>.tmp<pid>.<random>`), flushed to the disk (fsync, on a local disk), then renamed
  over `path` (a local or gs:// path). If any of it fails (a full disk), the temporary
  file is removed and the error raised: `path` keeps its old content, or stays absent."""
  path = epath.Path(path)
  tmp = path.parent / f'{path.name}.tmp{os.getpid()}.{uuid.uuid4().hex[:8]}'
  try:
    if fields.is_local(path):
      with open(os.fspath(tmp), 'w') as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    else:
      tmp.write_text(text)
    tmp.replace(path)
  except BaseException as e:
    with contextlib.suppress(OSError):
      tmp.unlink(missing_ok=True)
    if isinstance(e, OSError) and e.filename in (None, os.fspath(tmp)):
      e.filename = os.fspath(path)  # the file it was writing, not its temporary name
    raise


def write_json(path, name: str, obj) -> None:
  """Writes `path/name` as strict JSON, replacing it whole (`write_atomic`)."""
  write_atomic(epath.Path(path) / name, dumps(obj, indent=2, sort_keys=True))


def open_run(
  path, config, *, writer: bool = True, restart: bool = False, num_steps: Optional[int] = None
) -> Run:
  """Checks the workdir's identity (or moves the old run aside), locks it, stores the config.

  `restart` takes the workdir's lock before moving the old run aside, so it is
  refused (WorkdirError) while another trainer holds it. `num_steps`: the run's
  length, checked against what the workdir holds (see the module docstring).
  """
  path = epath.Path(path)
  if restart and (path / CONFIG).exists():
    if writer:
      lock = _Lock(path)
      try:
        lock.acquire()
      except OSError as e:
        raise WorkdirError(unwritable(path, e)) from None
      stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
      aside = path.parent / f'{path.name}.replaced-{stamp}'
      try:
        path.rename(aside)
      except OSError as e:
        lock.release()
        raise WorkdirError(unwritable(path, e)) from None
      except BaseException:
        lock.release()
        raise
      (aside / LOCK).unlink(missing_ok=True)  # ours, moved with the folder
      logging.warning('--restart: moved the previous run in %s to %s', path, aside)
  else:
    check_identity(path, config)
  return Run(path, config, writer=writer, num_steps=num_steps)

"""What goes wrong in a workdir, in one line: `WorkdirError` (another run's workdir, one in
use, one that cannot be written), and a write that failed: a full disk (with how to go
on), a folder it may not write, a file where the workdir should be.
"""

import errno
import os
from typing import Optional

from configs import fields
from train.workdir import layout


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
    steps = layout.checkpoint_steps(workdir)
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

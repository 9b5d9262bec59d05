"""One trainer at a time in a workdir: `trainer.lock`, which process holds it.

A lock file keeps a second trainer out of a workdir in use (`--restart` included); a lock
left by a process that is gone, or an empty or unreadable one (its trainer stopped before
writing it: a full disk), is replaced with a warning.
"""

import json
import os
import socket
import time
from typing import Optional

from absl import logging
from etils import epath

from configs import fields
from train.workdir import errors
from train.workdir import layout


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class Lock:
  """`path/trainer.lock`: which process (pid, host) trains in the workdir."""

  def __init__(self, path):
    self.path = epath.Path(path)
    self.file = self.path / layout.LOCK
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
        raise errors.WorkdirError(
          f'{self.path} is in use by another trainer (pid {other.get("pid")} on '
          f'{other.get("host")}); wait for it, or, if that process is gone, delete '
          f'{self.file}'
        ) from None
      logging.warning('Replacing a stale lock in %s (%s)', self.path, stale)
      self._remove_if(text)
    raise errors.WorkdirError(
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

"""A full disk, or a read-only folder, for the file writes Python makes in this process.

    with full_disk.installed(folder):        # every write of a file under `folder` fails
      ...                                     # with OSError(ENOSPC), as on a full disk
    with full_disk.installed(folder, when=lambda path: ...):   # some files, some of the time
    with full_disk.read_only(folder):         # creating a file or folder there: EROFS

As on a real full disk, files are still created and opened; what is written to them
fails (`OSError(errno.ENOSPC, 'No space left on device')`, at the write or the flush),
so a writer that is not careful leaves an empty file behind. Only writes made through
Python's `open` / `io.open` / `os.fdopen` are affected: the trainer's files and Orbax's
metadata files, not TensorStore's array data nor TensorFlow's events (C++ code).
`when(path)` is asked at each write, so a disk can fill up while a file is open.
"""

import builtins
import contextlib
import errno
import io
import os

_WRITE_MODES = set('wax+')


def _under(path, folder: str) -> bool:
  try:
    path = os.path.abspath(os.fspath(path))
  except TypeError:
    return False
  return path == folder or path.startswith(folder + os.sep)


class _File:
  """A file object whose writes fail while `failing()` says the disk is full."""

  def __init__(self, file, failing):
    self._file, self._failing = file, failing

  def _check(self):
    if self._failing():
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  def write(self, data):
    self._check()
    return self._file.write(data)

  def writelines(self, lines):
    self._check()
    return self._file.writelines(lines)

  def flush(self):
    self._check()
    return self._file.flush()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._file.close()

  def __iter__(self):
    return iter(self._file)

  def __getattr__(self, name):
    return getattr(self._file, name)


@contextlib.contextmanager
def _patched(replacements):
  """Sets (module, name, value) attributes for the block, then puts the originals back."""
  saved = [(module, name, getattr(module, name)) for module, name, _ in replacements]
  for module, name, value in replacements:
    setattr(module, name, value)
  try:
    yield
  finally:
    for module, name, value in saved:
      setattr(module, name, value)


@contextlib.contextmanager
def installed(folder, when=None):
  """Writes of files under `folder` fail with ENOSPC while `when(path)` is true (default:
  always)."""
  folder = os.path.abspath(os.fspath(folder))
  real_open, real_os_open = io.open, os.open
  paths = {}  # fd -> path, for os.fdopen

  def os_open(path, flags, *args, **kwargs):
    fd = real_os_open(path, flags, *args, **kwargs)
    paths[fd] = path
    return fd

  def open_(file, mode='r', *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    path = paths.get(file) if isinstance(file, int) else file
    if set(mode) & _WRITE_MODES and path is not None and _under(path, folder):
      return _File(f, lambda: when is None or when(os.fspath(path)))
    return f

  with _patched([(builtins, 'open', open_), (io, 'open', open_), (os, 'open', os_open)]):
    yield


@contextlib.contextmanager
def read_only(folder):
  """Creating files or folders under `folder` (or `folder` itself), or opening one there
  for writing, fails with EROFS, as on a read-only file system."""
  folder = os.path.abspath(os.fspath(folder))
  real_open, real_os_open, real_mkdir = io.open, os.open, os.mkdir

  def refuse(path):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

  def os_open(path, flags, *args, **kwargs):
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and _under(path, folder):
      refuse(path)
    return real_os_open(path, flags, *args, **kwargs)

  def open_(file, mode='r', *args, **kwargs):
    if set(mode) & _WRITE_MODES and not isinstance(file, int) and _under(file, folder):
      refuse(file)
    return real_open(file, mode, *args, **kwargs)

  def mkdir(path, *args, **kwargs):
    if _under(path, folder) and not os.path.isdir(path):
      refuse(path)
    return real_mkdir(path, *args, **kwargs)

  with _patched(
    [(builtins, 'open', open_), (io, 'open', open_), (os, 'open', os_open), (os, 'mkdir', mkdir)]
  ):
    yield

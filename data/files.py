"""Data files through one door: local paths with Python's own file functions, URLs
(gs://..., s3://...) with TensorFlow's `tf.io.gfile`.

A run on local files (the generated datasets, `.npz` arrays) so never imports
TensorFlow for its data; a bucket path imports it when first read. Not `etils.epath`
(the workdir's): it has no TensorFlow-only file systems, such as the `ram://` the
data tests use or those of TensorFlow's I/O plug-ins.
"""

import os
from typing import NamedTuple


class FileStatistics(NamedTuple):
  """What `stat` gives, as `tf.io.gfile.stat` does: size in bytes, modification time in
  nanoseconds (0 where the file system keeps none), whether it is a folder."""

  length: int
  mtime_nsec: int
  is_directory: bool


def is_url(path) -> bool:
  """Whether `path` names a file system by scheme (gs://, s3://, ...)."""
  return '://' in str(path)


class _Local:
  """The part of `tf.io.gfile` the data readers use, for local paths."""

  GFile = staticmethod(open)
  exists = staticmethod(os.path.exists)
  isdir = staticmethod(os.path.isdir)
  listdir = staticmethod(os.listdir)

  @staticmethod
  def stat(path) -> 'FileStatistics':
    s = os.stat(path)
    return FileStatistics(s.st_size, s.st_mtime_ns, os.path.isdir(path))

  @staticmethod
  def makedirs(path) -> None:
    os.makedirs(path, exist_ok=True)

  @staticmethod
  def rename(src, dst, overwrite: bool = False) -> None:
    if not overwrite and os.path.exists(dst):
      raise FileExistsError(f'{dst} exists')
    os.replace(src, dst)


def gfile(path):
  """`tf.io.gfile` for a URL, else a local stand-in with the same functions."""
  if is_url(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return tf.io.gfile
  return _Local


def read_errors(path) -> tuple:
  """The exceptions that mean `path` could not be read: OSError, and TensorFlow's
  OpError for a URL."""
  if is_url(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return (OSError, tf.errors.OpError)
  return (OSError,)

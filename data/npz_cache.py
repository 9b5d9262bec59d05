"""Generated datasets cached as `.npz` files: written atomically, with their settings inside.

A generator (`listops.py`, `pathfinder.py`) writes each split once into a cache
folder with the settings that produced it (`settings_json`); a later run reads
the file back when the settings match, and regenerates it when they do not.

Every file goes through `tf.io.gfile`, as the 'arrays' source reads them, so
the cache folder may be a bucket (gs://...) as well as a local folder.
"""
import io
import json
import os
import zipfile
from typing import Optional

import numpy as np


def _gfile():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def makedirs(folder: str) -> None:
  """Creates `folder` (and its parents) if missing."""
  _gfile().makedirs(folder)


def read_bytes(path: str) -> bytes:
  """The contents of `path`."""
  with _gfile().GFile(path, 'rb') as f:
    return f.read()


def read_array(path: str, key: str) -> np.ndarray:
  """The array `key` of the `.npz` file `path`."""
  with np.load(io.BytesIO(read_bytes(path)), allow_pickle=False) as data:
    return data[key]


def read_settings(path: str) -> Optional[dict]:
  """The settings stored in a cached split, or None (missing or unreadable file)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    if not tf.io.gfile.exists(path):
      return None
    return json.loads(read_array(path, 'settings_json').tobytes().decode('utf-8'))
  except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, tf.errors.OpError):
    return None


def save_npz(path: str, compressed: bool = True, **arrays) -> None:
  """Writes `path` atomically (a temporary file renamed), so a killed run leaves no half file."""
  gfile = _gfile()
  buffer = io.BytesIO()  # zipfile seeks back; a GFile being written cannot
  (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
  tmp = f'{path}.tmp{os.getpid()}'
  with gfile.GFile(tmp, 'wb') as f:
    f.write(buffer.getvalue())
  gfile.rename(tmp, path, overwrite=True)

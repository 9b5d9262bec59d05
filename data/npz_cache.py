"""Generated datasets cached as `.npz` files: written atomically, with their settings inside.

A generator (`listops.py`, `pathfinder.py`) writes each split once into a cache
folder with the settings that produced it (`settings_json`); a later run reads
the file back when the settings match, and regenerates it when they do not.

Every file goes through `files.gfile` (`tf.io.gfile` for a URL), as the 'arrays'
source reads them, so the cache folder may be a bucket (gs://...) as well as a
local folder.
"""
import io
import json
import os
import zipfile
from typing import Optional

import numpy as np

from data import files


def makedirs(folder: str) -> None:
  """Creates `folder` (and its parents) if missing."""
  files.gfile(folder).makedirs(folder)


def read_bytes(path: str) -> bytes:
  """The contents of `path`."""
  with files.gfile(path).GFile(path, 'rb') as f:
    return f.read()


def read_array(path: str, key: str) -> np.ndarray:
  """The array `key` of the `.npz` file `path`."""
  with np.load(io.BytesIO(read_bytes(path)), allow_pickle=False) as data:
    return data[key]


def read_settings(path: str) -> Optional[dict]:
  """The settings stored in a cached split, or None (missing or unreadable file)."""
  try:
    if not files.gfile(path).exists(path):
      return None
    return json.loads(read_array(path, 'settings_json').tobytes().decode('utf-8'))
  except (KeyError, ValueError, EOFError, zipfile.BadZipFile) + files.read_errors(path):
    return None


def save_npz(path: str, compressed: bool = True, **arrays) -> None:
  """Writes `path` atomically (a temporary file renamed), so a killed run leaves no half file."""
  gfile = files.gfile(path)
  buffer = io.BytesIO()  # zipfile seeks back; a GFile being written cannot
  (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
  tmp = f'{path}.tmp{os.getpid()}'
  with gfile.GFile(tmp, 'wb') as f:
    f.write(buffer.getvalue())
  gfile.rename(tmp, path, overwrite=True)

"""Generated datasets cached as `.npz` files: written atomically, with their settings inside.

A generator (`listops.py`, `pathfinder.py`) writes each split once into a cache
folder with the settings that produced it (`settings_json`); a later run reads
the file back when the settings match, and regenerates it when they do not.
"""
import json
import os
import zipfile
from typing import Optional

import numpy as np


def read_settings(path: str) -> Optional[dict]:
  """The settings stored in a cached split, or None (missing or unreadable file)."""
  try:
    with np.load(path) as data:
      return json.loads(data['settings_json'].tobytes().decode('utf-8'))
  except (OSError, KeyError, ValueError, zipfile.BadZipFile):
    return None


def save_npz(path: str, **arrays) -> None:
  """Writes `path` atomically (a temporary file renamed), so a killed run leaves no half file."""
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'wb') as f:
    np.savez_compressed(f, **arrays)
  os.replace(tmp, path)

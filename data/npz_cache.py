"""Generated datasets cached as `.npz` files: written atomically, with their settings inside.

A generator (`listops.py`, `mqar.py`, `pathfinder.py`, `text_bytes.py`) writes each
split once into a cache folder with the settings that produced it (`settings_json`);
a later run reads the file back when the settings match, and regenerates it when they
do not. A file's name holds `settings_key` of everything that makes it (seed and split
sizes included), so runs with other settings sharing one folder never overwrite each
other's files.

`problem` says why a cached split cannot be used as it is: besides other settings, a
damaged file (truncated, or bytes changed: a zip member fails its CRC check) or one
holding fewer rows than its settings say; its generator then writes it again, as it
writes a missing one.

Every file goes through `files.gfile` (`tf.io.gfile` for a URL), as the 'arrays'
source reads them, so the cache folder may be a bucket (gs://...) as well as a
local folder.
"""

import hashlib
import io
import json
import os
from typing import Dict, Mapping, Optional, Sequence, Tuple
import zipfile
import zlib

import numpy as np

from data import files


def settings_key(settings) -> str:
  """12 hex digits of the sha256 of `settings` (JSON, keys sorted): the part of a cached
  file's name that keeps files of other settings apart."""
  return hashlib.sha256(settings_json(settings)).hexdigest()[:12]


def settings_json(settings) -> np.ndarray:
  """`settings` as the bytes of its JSON (keys sorted): the `settings_json` array a cached
  file keeps, which `problem` compares."""
  return np.frombuffer(json.dumps(settings, sort_keys=True).encode('utf-8'), np.uint8)


def check_sizes(sizes: Mapping[str, int]) -> None:
  """A one-line ValueError for a split name that cannot be part of a file name, or a
  negative size, in `sizes` ({split: examples})."""
  for split, n in sizes.items():
    if not split or not split.replace('_', '').replace('-', '').isalnum():
      raise ValueError(f'split names must be letters, digits, "_" or "-", got {split!r}')
    if n < 0:
      raise ValueError(f'sizes[{split!r}] must be >= 0, got {n}')


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


OTHER_SETTINGS = 'written for other settings'  # `problem`: regenerated without a word
# path -> (size, modification time, settings, shapes) of a file `problem` found usable in
# this process: the same file asked the same again is not read again.
_USABLE: Dict[str, Tuple] = {}


def problem(path: str, settings: dict, shapes: Optional[Mapping[str, Sequence[int]]] = None) -> str:
  """Why the cached split `path` cannot be used as it is ('' when it can): 'missing',
  OTHER_SETTINGS, or (a file its generator must replace, and says so) 'damaged (...)' or
  "its 'inputs' array is [50, 32], its settings say [200, 32]".

  It can when it holds `settings`, every array reads whole (each zip member's CRC), and
  each array of `shapes` ({key: shape}) has that shape: a file truncated or changed after
  it was written, or holding fewer rows than its settings say, is not used. A file found
  usable is read once per process: asked again with the same size and modification time
  (where the file system keeps one), it is usable without a read.
  """
  gfile = files.gfile(path)
  damaged = (KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
  try:
    if not gfile.exists(path):
      return 'missing'
    stat = gfile.stat(path)
    asked = (
      stat.length,
      stat.mtime_nsec,
      json.dumps(settings, sort_keys=True),
      sorted((k, tuple(v)) for k, v in (shapes or {}).items()),
    )
    if stat.mtime_nsec and _USABLE.get(path) == asked:
      return ''
    raw = read_bytes(path)
  except files.read_errors(path) as e:
    return f'damaged (unreadable: {_first_line(e)})'
  try:
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
      with archive.open('settings_json.npy') as f:
        stored = json.loads(np.lib.format.read_array(f, allow_pickle=False).tobytes())
      if stored != settings:
        return OTHER_SETTINGS
      for key, shape in (shapes or {}).items():
        with archive.open(f'{key}.npy') as f:
          version = np.lib.format.read_magic(f)
          read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
          )
          have = read(f)[0]
        if tuple(have) != tuple(shape):
          return f'its {key!r} array is {list(have)}, its settings say {list(shape)}'
      bad = archive.testzip()
      if bad is not None:
        return f'damaged ({bad} fails its CRC check)'
  except damaged as e:
    return f'damaged ({_first_line(e)})'
  _USABLE[path] = asked
  return ''


def report_written(path: str, why: str, written: str, verbose: bool = False) -> None:
  """Says what a generator wrote to `path` (`why`: `problem`'s answer before): always for a
  file replaced because it was damaged or short ('<path>: <why>; rebuilt: <written>'),
  otherwise only when `verbose` ('<path>: <written>')."""
  if why not in ('', 'missing', OTHER_SETTINGS):
    print(f'{path}: {why}; rebuilt: {written}', flush=True)
  elif verbose:
    print(f'{path}: {written}', flush=True)


def _first_line(error: BaseException) -> str:
  text = str(getattr(error, 'message', '') or error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def save_npz(path: str, compressed: bool = True, **arrays) -> None:
  """Writes `path` atomically (a temporary file renamed), so a killed run leaves no half file."""
  gfile = files.gfile(path)
  buffer = io.BytesIO()  # zipfile seeks back; a GFile being written cannot
  (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
  tmp = f'{path}.tmp{os.getpid()}'
  with gfile.GFile(tmp, 'wb') as f:
    f.write(buffer.getvalue())
  gfile.rename(tmp, path, overwrite=True)

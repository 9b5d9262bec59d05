"""ListOps splits as `.npz` files (`data/listops.py` draws the expressions): each split
written once into a cache folder, named by every setting that makes it, and disjoint from
the splits before it.

    paths = listops_files.write_splits(folder, seed=0, sizes={'train': 96_000, 'test': 2_000})
    pattern = listops_files.split_path(folder, '{split}', seed=0, sizes=...)
"""

import os
import types
from typing import Dict, List, Set, Tuple
import zlib

import numpy as np

from data import npz_cache
from data.listops import fingerprint
from data.listops import generate

DEFAULT_SIZES = types.MappingProxyType({'train': 96_000, 'validation': 2_000, 'test': 2_000})
_FORMAT = 'listops-v1'  # bump when the generator changes, so old files get redrawn


def split_seed(seed: int, split: str) -> Tuple[int, int]:
  """The seed of one split: (seed, crc32 of its name), so splits draw independently."""
  return (int(seed), zlib.crc32(split.encode('utf-8')))


def _generator_options(kw) -> Dict[str, int]:
  """`generate`'s min_length, max_depth and max_args: LRA's 500, 10 and 10 unless `kw`
  gives them."""
  unknown = set(kw) - {'min_length', 'max_depth', 'max_args'}
  if unknown:
    raise ValueError(f'unknown arguments {sorted(unknown)}; valid: min_length, max_depth, max_args')
  return {'min_length': 500, 'max_depth': 10, 'max_args': 10, **kw}


def split_settings(seed: int = 0, sizes=None, max_length: int = 2000, **kw) -> Dict[str, dict]:
  """{split: the settings its file is written from}, in the order of `sizes` (default
  `DEFAULT_SIZES`); `kw`: `min_length`, `max_depth`, `max_args` of `generate`."""
  sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
  gen_kw = _generator_options(kw)
  names = list(sizes)
  return {
    split: _settings(seed, split, sizes, names[:i], max_length, gen_kw)
    for i, split in enumerate(names)
  }


def split_path(
  folder: str,
  split: str,
  min_length: int = 500,
  max_length: int = 2000,
  seed: int = 0,
  sizes=None,
  **kw,
) -> str:
  """`folder/listops_<min_length>-<max_length>_<key>_{split}.npz`, `<key>` the
  `npz_cache.settings_key` of every split's settings (`split_settings`: seed, sizes,
  `max_depth` and `max_args` included), so runs of other settings sharing the folder
  never overwrite each other's files."""
  key = npz_cache.settings_key(split_settings(seed, sizes, max_length, min_length=min_length, **kw))
  return os.path.join(folder, f'listops_{min_length}-{max_length}_{key}_{split}.npz')


def write_splits(
  folder: str, seed: int = 0, sizes=None, max_length: int = 2000, verbose: bool = True, **kw
) -> List[str]:
  """Writes the `split_path` file of each split; skips files already up to date.

  Each file holds `tokens` (int16 `[n, max_length]`, 0 = padding,
  left-aligned), `y` (int64 `[n]`, 0..9), `lengths` (int64 `[n]`) and
  `settings_json` (uint8 bytes of the JSON generation settings). A file whose
  settings match is left alone, so an interrupted run resumes at the first
  missing split; runs of other settings (seed and sizes included) write files of
  other names (`split_path`) beside it. Splits are generated in
  the order of `sizes`, each from `split_seed(seed, split)` and excluding the
  expressions of the splits before it, so they are disjoint.

  Args:
    folder: output folder (created if missing).
    seed: base seed.
    sizes: {split name: number of examples}; default `DEFAULT_SIZES` (LRA's
      96,000 / 2,000 / 2,000).
    max_length: see `generate`.
    verbose: print the progress of what is generated.
    **kw: `min_length`, `max_depth`, `max_args` of `generate`.

  Returns:
    The paths of the split files, in the order of `sizes`.
  """
  sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
  gen_kw = _generator_options(kw)
  npz_cache.check_sizes(sizes)
  names = list(sizes)
  settings = split_settings(seed, sizes, max_length, **gen_kw)
  npz_cache.makedirs(folder)
  paths = {
    s: split_path(folder, s, max_length=max_length, seed=seed, sizes=sizes, **gen_kw) for s in names
  }
  shapes = lambda s: {'tokens': (sizes[s], max_length), 'y': (sizes[s],), 'lengths': (sizes[s],)}
  why = {s: npz_cache.problem(paths[s], settings[s], shapes(s)) for s in names}
  todo = [s for s in names if why[s]]  # missing, other settings, damaged or short
  exclude: Set[bytes] = set()
  for i, split in enumerate(names):
    path = paths[split]
    feeds_later = any(s in todo for s in names[i + 1 :])  # a later split must avoid this one
    if split in todo:
      examples = generate(
        sizes[split],
        split_seed(seed, split),
        max_length=max_length,
        exclude=exclude,
        progress=f'listops {split}' if verbose else None,
        **gen_kw,
      )
      npz_cache.save_npz(
        path,
        tokens=examples.tokens,
        y=examples.labels,
        lengths=examples.lengths,
        settings_json=npz_cache.settings_json(settings[split]),
      )
      npz_cache.report_written(path, why[split], f'{sizes[split]} ListOps examples written')
      rows = examples.tokens
    else:  # up to date (read whenever the data is opened: no message)
      rows = _load_tokens(path) if feeds_later else ()
    if feeds_later:
      exclude.update(fingerprint(row) for row in rows)
  return [paths[s] for s in names]


def _load_tokens(path: str) -> np.ndarray:
  return npz_cache.read_array(path, 'tokens')


def _settings(seed, split, sizes, before, max_length, gen_kw) -> dict:
  """What determines a split's content (the splits before it are excluded from it)."""
  return {
    'format': _FORMAT,
    'seed': int(seed),
    'split': split,
    'num_examples': int(sizes[split]),
    'excludes': [[b, int(sizes[b])] for b in before],
    'max_length': int(max_length),
    **{k: int(v) for k, v in sorted(gen_kw.items())},
  }

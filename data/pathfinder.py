"""Pathfinder (Linsley et al., 2018) as in Long Range Arena (Tay et al., 2021): the
generated splits, cached as .npz files, and a reader for the released 32x32 files that LRA
trains on.

The task: a 32x32 grayscale image holds two discs and several dashed curves
("paths"); the label is 1 when the discs sit at the two ends of the same path
and 0 when they sit at ends of two different paths. The images are drawn by
`pathfinder_contours.generate` (how they differ from the released ones is said there).

Released files. LRA's Pathfinder32 data (lra_release/pathfinder32/) has one
folder per difficulty, `curv_baseline` (6 dashes), `curv_contour_length_9`
and `curv_contour_length_14`, each with `imgs/<batch>/sample_<i>.png` and
`metadata/<batch>.npy`. Despite the extension LRA reads the metadata files
as text, one line per image: `imgs/<batch> sample_<i>.png <i> <label> <continuity>
<contour_length> <distractor_length> <paddle_length> <paddle_thickness>
<paddle_margin> <num_contrasts>`; LRA reads columns 0, 1 and 3 and drops
images whose file is empty.
"""

import io
import logging
import os
import types
from typing import Dict, List, Optional, Tuple
import zlib

import numpy as np

from data import npz_cache
from data import pathfinder_contours

IMAGE_SIZE = pathfinder_contours.IMAGE_SIZE
RELEASED_FOLDERS = types.MappingProxyType(
  {6: 'curv_baseline', 9: 'curv_contour_length_9', 14: 'curv_contour_length_14'}
)
DEFAULT_SIZES = types.MappingProxyType({'train': 160_000, 'validation': 20_000, 'test': 20_000})
_FORMAT = 'pathfinder-v1'  # bump when the drawing changes, so old files get redrawn


DRAWING_DEFAULTS = types.MappingProxyType(
  {
    'num_distractors': None,
    'distractor_length': None,
    'dash_length': 2,
    'gap': 1,
    'continuity': 1.0,
    'seed_distance': 7,
    'image_size': IMAGE_SIZE,
  }
)


def split_settings(seed: int = 0, sizes=None, contour_length: int = 14, **kw) -> Dict[str, dict]:
  """{split: the settings its file is drawn from}, in the order of `sizes` (default
  `DEFAULT_SIZES`); `kw`: the other arguments of `pathfinder_contours.generate`
  (`DRAWING_DEFAULTS`' names), checked there."""
  sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
  if set(kw) - set(DRAWING_DEFAULTS):
    raise ValueError(
      f'unknown arguments {sorted(set(kw) - set(DRAWING_DEFAULTS))}; '
      f'valid: {sorted(DRAWING_DEFAULTS)}'
    )
  drawing = pathfinder_contours.checked_settings(
    contour_length=contour_length, **{**DRAWING_DEFAULTS, **kw}
  )
  return {
    split: {'format': _FORMAT, 'seed': int(seed), 'split': split, 'num_examples': int(n), **drawing}
    for split, n in sizes.items()
  }


def split_path(
  folder: str,
  split: str,
  contour_length: int = 14,
  image_size: int = IMAGE_SIZE,
  seed: int = 0,
  sizes=None,
  **kw,
) -> str:
  """`folder/pathfinder{contour_length}_<key>_{split}.npz` (`..._{image_size}px_...` for
  other sizes), `<key>` the `npz_cache.settings_key` of every split's settings
  (`split_settings`: seed, sizes and the drawing included), so runs of other settings
  sharing the folder never overwrite each other's files."""
  every = split_settings(seed, sizes, contour_length, image_size=image_size, **kw)
  size = '' if image_size == IMAGE_SIZE else f'_{image_size}px'
  key = npz_cache.settings_key(every)
  return os.path.join(folder, f'pathfinder{contour_length}{size}_{key}_{split}.npz')


def write_splits(
  folder: str, seed: int = 0, sizes=None, contour_length: int = 14, verbose: bool = True, **kw
) -> List[str]:
  """Writes the `split_path` files of each split; skips files already up to date.

  Each file holds `x` (uint8 `[n, size, size]`), `y` (int64 `[n]`) and
  `settings_json` (uint8 bytes of the JSON generation settings). A file whose
  settings match is left alone (an interrupted run resumes at the first
  missing split); runs of other settings (seed and sizes included) write files of
  other names (`split_path`) beside it. Each split is drawn from its own seed,
  (seed, crc32 of its name), so the splits are independent draws.

  Args:
    folder: output folder (created if missing).
    seed: base seed.
    sizes: {split name: number of images}; default `DEFAULT_SIZES` (LRA's
      160,000 / 20,000 / 20,000, an 80/10/10 split of 200,000).
    contour_length: see `pathfinder_contours.generate`.
    verbose: print the progress of what is generated.
    **kw: other arguments of `pathfinder_contours.generate` (not `with_discs` or `progress`).

  Returns:
    The paths of the split files, in the order of `sizes`.
  """
  sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
  npz_cache.check_sizes(sizes)
  every = split_settings(seed, sizes, contour_length, **kw)
  npz_cache.makedirs(folder)
  paths = []
  for split, n in sizes.items():
    settings = every[split]
    drawing = {
      k: v for k, v in settings.items() if k not in ('format', 'seed', 'split', 'num_examples')
    }
    path = split_path(folder, split, seed=seed, sizes=sizes, **drawing)
    paths.append(path)
    split_seed = (int(seed), zlib.crc32(split.encode('utf-8')))
    side = drawing['image_size']
    why = npz_cache.problem(path, settings, {'x': (n, side, side), 'y': (n,)})
    if not why:  # up to date: no message (read at every open)
      continue
    images, labels = pathfinder_contours.generate(
      n, split_seed, progress=f'pathfinder {os.path.basename(path)}' if verbose else None, **drawing
    )
    npz_cache.save_npz(
      path,
      x=images,
      y=labels,
      settings_json=npz_cache.settings_json(settings),
    )
    npz_cache.report_written(path, why, f'{n} Pathfinder images written')
  return paths


def released_folder(root: str, contour_length: int = 14) -> str:
  """The folder of one difficulty under `root` (e.g. lra_release/pathfinder32)."""
  if contour_length not in RELEASED_FOLDERS:
    raise ValueError(
      f'contour_length must be one of {sorted(RELEASED_FOLDERS)}, got {contour_length}'
    )
  return os.path.join(root, RELEASED_FOLDERS[contour_length])


def _metadata_rows(path: str) -> List[List[str]]:
  """Rows of one metadata file: text lines split on whitespace (or a saved string array)."""
  raw = npz_cache.read_bytes(path)
  if raw.startswith(b'\x93NUMPY'):  # a real .npy file, as the generator's np.save would write
    return [[str(v) for v in row] for row in np.load(io.BytesIO(raw), allow_pickle=False)]
  return [line.split() for line in raw.decode('utf-8').splitlines() if line.strip()]


def _decode_png(path: str) -> Optional[np.ndarray]:
  """uint8 `[h, w]` grayscale, or None for an empty or undecodable file."""
  raw = npz_cache.read_bytes(path)
  if not raw:
    return None
  try:
    from PIL import Image  # pylint: disable=g-import-not-at-top

    with Image.open(io.BytesIO(raw)) as image:
      return np.asarray(image.convert('L'), np.uint8)
  except ImportError:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    try:
      return tf.io.decode_png(raw, channels=1).numpy()[..., 0]
    except tf.errors.InvalidArgumentError:
      return None
  except (OSError, ValueError):
    return None


def read_released(root: str, contour_length: int = 14) -> Tuple[np.ndarray, np.ndarray]:
  """Reads one difficulty of the released Pathfinder files, in metadata order.

  Args:
    root: the folder holding `curv_baseline/`, `curv_contour_length_9/` and
      `curv_contour_length_14/` (LRA's lra_release/pathfinder32); local or
      gs://, read through `tf.io.gfile`.
    contour_length: 6, 9 or 14.

  Returns:
    images: uint8 `[n, h, w]` (32x32 for LRA's Pathfinder32).
    labels: int64 `[n]`, 0 or 1.
    Metadata files are read in numeric order of their names, lines in file
    order. Images whose file is empty or cannot be decoded are skipped, as
    LRA skips empty ones; their number is logged.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  folder = released_folder(root, contour_length)
  meta_dir = os.path.join(folder, 'metadata')
  if not tf.io.gfile.isdir(meta_dir):
    raise FileNotFoundError(f'no metadata folder {meta_dir}')
  names = [n for n in tf.io.gfile.listdir(meta_dir) if n.endswith('.npy')]
  names.sort(key=lambda n: (int(n[:-4]) if n[:-4].isdigit() else float('inf'), n))
  images, labels, skipped = [], [], 0
  for name in names:
    for row in _metadata_rows(os.path.join(meta_dir, name)):
      if len(row) < 4:
        raise ValueError(
          f'{name}: metadata rows need >= 4 columns (dir, file, index, label), got {row}'
        )
      image = _decode_png(os.path.join(folder, row[0], row[1]))
      if image is None:
        skipped += 1
        continue
      images.append(image)
      labels.append(int(float(row[3])))
  if skipped:
    logging.warning('%s: skipped %d empty or undecodable images', folder, skipped)
  if not images:
    raise ValueError(f'no images listed in {meta_dir}')
  shapes = {image.shape for image in images}
  if len(shapes) > 1:
    raise ValueError(f'images of different shapes in {folder}: {sorted(shapes)}')
  return np.stack(images), np.asarray(labels, np.int64)

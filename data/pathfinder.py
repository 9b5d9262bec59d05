"""Pathfinder images (Linsley et al., 2018) as in Long Range Arena (Tay et al., 2021).

Two things live here: a numpy generator of Pathfinder-like images, and a
reader for the released 32x32 files that LRA trains on.

The task: a 32x32 grayscale image holds two discs and several dashed curves
("paths"); the label is 1 when the discs sit at the two ends of the same path
and 0 when they sit at ends of two different paths.

Generator. Like the original procedure (`snakes2.py` of
github.com/drewlinsley/pathfinder, with LRA's 32x32 settings listed in LRA's
`lra_benchmarks/data/pathfinder.py`), every image gets two target paths of
`contour_length` dashes whose first points lie `seed_distance` (7) pixels
apart near the image centre, then shorter distractor paths; the label only
decides where the two discs go (positive: both ends of one target path;
negative: the start of one and the end of the other), so positives and
negatives are drawn by the same process. A path is a chain of dashes: it
advances one pixel per step (a unit step along the major axis, so the points
of a dash are 8-connected), draws `dash_length` points, skips `gap` points,
and turns before each new dash. As in the original, the turn is drawn
among the directions that keep the path clear of everything already drawn,
with weight cos^2(continuity * turn); here from 24 candidates, one per equal
slice of |turn| < 90 degrees / continuity. A target path that finds no free
direction is abandoned and the image redrawn.

How the images differ from the released files:

  * Drawing: binary 0/255, one-pixel-wide dashes rasterised on the pixel grid,
    no anti-aliasing and no contrast variation (the original draws 0.5-pixel
    lines at 2x and downsamples with Lanczos, which gives grey, blurred
    dashes, with a contrast factor of 2 * 0.75).
  * Sizes: dashes of 2 pixels with 1-pixel gaps (original: paddle length 2
    with margin 1, a 4-pixel step between paddles); discs are 3x3 squares (the
    original: radius 1.5, anti-aliased).
  * Separation: every point of a path (gaps included) keeps at least one empty
    pixel (8-neighbourhood) from other paths, and target ends keep two, so a
    flood fill cannot jump between paths; the original keeps a margin too
    (paddle_margin 1), but its anti-aliased strokes can bleed into it.
  * Order: the two target paths grow one after the other (the original grows
    them in alternation, one paddle each).
  * Distractors: `num_distractors` paths of `distractor_length` dashes
    (default, as LRA: contour_length // 3 dashes, 20 // that many paths); a
    distractor that finds no room is left out or, unlike the original, which
    discards it, stays shorter. No single-dash clutter is added (the original
    can add it; whether LRA's files have it is not stated).
  * Labels are exactly balanced (a permutation), not drawn one by one.
  * The first target path starts uniformly in the central square that the
    original allows (2 * seed_distance from each border), the second on the
    circle of radius seed_distance around it.

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
import json
import logging
import os
import time
import types
from typing import List, Optional, Sequence, Tuple, Union
import zlib

import numpy as np

from data import npz_cache

IMAGE_SIZE = 32
RELEASED_FOLDERS = types.MappingProxyType(
  {6: 'curv_baseline', 9: 'curv_contour_length_9', 14: 'curv_contour_length_14'}
)
DEFAULT_SIZES = types.MappingProxyType({'train': 160_000, 'validation': 20_000, 'test': 20_000})
_FORMAT = 'pathfinder-v1'  # bump when the drawing changes, so old files get redrawn
_WALL = -1  # owner of canvas cells that no path point may occupy
_NEVER = np.iinfo(np.int32).max  # stamp of cells that are not path points
_SELF_SPAN = 2  # a point may touch its own path's last 2 points (a bend)
_BATCH = 1024  # images drawn at once
_DIRECTIONS = 24  # candidate directions per dash, one per equal slice of the allowed turns
_START_CANDIDATES = 8  # start points tried at once per image
_START_ROUNDS = 3  # rounds of start points before a path gives up


class _Canvas:
  """A batch of images being drawn, with the bookkeeping that keeps paths apart.

  Coordinates are canvas coordinates: image coordinates + `pad`, where the
  border `pad` is wide enough that no candidate point nor its 5x5
  neighbourhood leaves the canvas, so lookups need no clipping.

  owner: int16 `[b, g, g]` (g = size + 2 pad): 0 free, _WALL, or the id
    (1, 2, ...) of the path whose point or reserved disc occupies the cell.
    Path points may lie in image rows and columns 1..size-2 only, so a disc
    around any point fits in the image.
  stamp: int32 `[b, g, g]`: when the cell's point was drawn (_NEVER if none).
  image: uint8 `[b, size, size]`, 0 or 255.
  clock: int32 `[b]`, the last stamp used per image.
  """

  def __init__(self, batch: int, size: int, pad: int):
    g = size + 2 * pad
    self.size, self.pad, self.g = size, pad, g
    self.owner = np.full((batch, g, g), _WALL, np.int16)
    self.owner[:, pad + 1 : pad + size - 1, pad + 1 : pad + size - 1] = 0
    self.stamp = np.full((batch, g, g), _NEVER, np.int32)
    self.image = np.zeros((batch, size, size), np.uint8)
    self.clock = np.zeros(batch, np.int32)
    self._base = np.arange(batch) * g * g
    d = np.arange(-2, 3)
    self._ring = {
      r: ((d[2 - r : 3 + r, None] * g) + d[None, 2 - r : 3 + r]).ravel() for r in (1, 2)
    }

  def _flat(self, b, ys, xs):
    return self._base[b][:, None] + ys * self.g + xs

  def fits(self, b, ys, xs, pid, stamps):
    """Whether all k new points of path `pid` fit: inside, and no other path or old own point
    in their 3x3 neighbourhoods. b `[m]`, ys/xs/stamps `[m, k]` -> `[m]`."""
    flat = self._flat(b, ys, xs)
    owner, stamp = self.owner.reshape(-1), self.stamp.reshape(-1)
    near = flat[..., None] + self._ring[1]
    owners = owner[near]
    clash = (owners > 0) & (owners != pid)
    clash |= (owners == pid) & (stamp[near] < stamps[..., None] - _SELF_SPAN)
    return (owner[flat] != _WALL).all(1) & ~clash.any((1, 2))

  def clear(self, b, y, x, pid):
    """Whether no other path lies within 2 pixels of points y, x `[m]` (room for a disc)."""
    owners = self.owner.reshape(-1)[self._flat(b, y[:, None], x[:, None]) + self._ring[2]]
    return ~((owners > 0) & (owners != pid)).any(1)

  def draw(self, b, ys, xs, pid, stamps, on):
    """Records points `[m, k]` of path `pid`; paints those where `on` `[k]`."""
    flat = self._flat(b, ys, xs)
    self.owner.reshape(-1)[flat] = pid
    self.stamp.reshape(-1)[flat] = stamps
    self.image[b[:, None], ys[:, on] - self.pad, xs[:, on] - self.pad] = 255
    self.clock[b] = stamps[:, -1]

  def reserve(self, b, y, x, pid):
    """Claims the free cells of a 3x3 disc around points y, x `[m]` for path `pid`."""
    owner = self.owner.reshape(-1)
    cells = self._flat(b, y[:, None], x[:, None]) + self._ring[1]
    owner[cells] = np.where(owner[cells] == 0, pid, owner[cells])

  def paint_disc(self, b, y, x):
    """Paints 3x3 discs around points y, x `[m]`."""
    for dy in (-1, 0, 1):
      for dx in (-1, 0, 1):
        self.image[b, y + dy - self.pad, x + dx - self.pad] = 255


def _start(canvas, rng, b, pid, low, high, around=None, distance=0.0, disc=False):
  """Places the first point of path `pid` in images b `[m]`.

  Uniform in [low, high) per coordinate (image coordinates), or, with `around`
  `[m, 2]`, on the circle of radius `distance` around it. With `disc`, the
  point needs room for a disc, which is then reserved. Candidates are tried
  `_START_CANDIDATES` at a time; the first that fits wins. Returns (ok `[m]`,
  point `[m, 2]` in canvas coordinates).
  """
  m = b.size
  point = np.zeros((m, 2), np.int64)
  ok = np.zeros(m, bool)
  for _ in range(_START_ROUNDS):
    idx = np.flatnonzero(~ok)
    if not idx.size:
      break
    rep = np.repeat(idx, _START_CANDIDATES)
    if around is None:
      cand = rng.integers(low, high, size=(rep.size, 2)) + canvas.pad
    else:
      phi = rng.uniform(0, 2 * np.pi, rep.size)
      offset = distance * np.stack([np.sin(phi), np.cos(phi)], 1)
      cand = np.floor(around[rep] + offset + 0.5).astype(np.int64)
      cand = np.clip(cand, 2, canvas.g - 3)  # outside the image: a wall, but a safe lookup
    stamps = canvas.clock[b[rep], None] + 1
    good = canvas.fits(b[rep], cand[:, :1], cand[:, 1:], pid, stamps)
    if disc:
      good &= canvas.clear(b[rep], cand[:, 0], cand[:, 1], pid)
    good = good.reshape(-1, _START_CANDIDATES)
    found = good.any(1)
    rows = (np.arange(idx.size) * _START_CANDIDATES + good.argmax(1))[found]
    g = idx[found]
    canvas.draw(b[g], cand[rows, :1], cand[rows, 1:], pid, stamps[rows], np.ones(1, bool))
    if disc:
      canvas.reserve(b[g], cand[rows, 0], cand[rows, 1], pid)
    point[g] = cand[rows]
    ok[g] = True
  return ok, point


def _directions(rng, heading, continuity):
  """Candidate headings `[m, _DIRECTIONS]` and their weights, for headings `[m]`.

  With `continuity` None (a first dash): one uniform heading in each of
  _DIRECTIONS equal slices of the circle, equal weights. Else: one turn in
  each equal slice of |turn| < pi / (2 continuity), weighted by
  cos^2(continuity * turn). Choosing among the candidates that fit in
  proportion to the weights approximates the original's choice among free
  directions.
  """
  m, k = heading.size, _DIRECTIONS
  frac = (np.arange(k) + rng.random((m, k))) / k
  if continuity is None:
    return 2 * np.pi * frac, np.ones((m, k))
  turn = (frac - 0.5) * np.pi / continuity
  return heading[:, None] + turn, np.cos(continuity * turn) ** 2


def _grow(canvas, rng, b, pid, origin, num_dashes, dash_length, gap, continuity, disc):
  """Extends path `pid` from its first point `origin` `[m, 2]` to `num_dashes` dashes.

  Each dash tries all `_DIRECTIONS` candidate directions at once and picks
  one of those that fit (see `_directions`). Returns (ok `[m]`, end point
  `[m, 2]` in canvas coordinates). With `disc`, the end needs room for a
  disc, which is then reserved.
  """
  m = b.size
  canvas.stamp[b, origin[:, 0], origin[:, 1]] = canvas.clock[b]  # the first point is the newest
  pos = origin.astype(np.float64)
  heading = np.zeros(m)
  ok = np.ones(m, bool)
  k = _DIRECTIONS
  for j in range(num_dashes):
    n = dash_length - 1 if j == 0 else dash_length + gap  # the first point is drawn already
    if n == 0:
      continue
    on = np.arange(n) >= (0 if j == 0 else gap)
    steps = np.arange(1, n + 1)
    idx = np.flatnonzero(ok)
    h, weight = _directions(rng, heading[idx], None if j == 0 else continuity)
    h, weight = h.ravel(), weight.ravel()
    rep = np.repeat(idx, k)
    unit = np.stack([np.sin(h), np.cos(h)], 1)
    unit /= np.abs(unit).max(1, keepdims=True)  # one pixel along the major axis
    pts = pos[rep, None, :] + unit[:, None, :] * steps[None, :, None]
    pix = np.floor(pts + 0.5).astype(np.int64)
    stamps = canvas.clock[b[rep], None] + steps
    good = canvas.fits(b[rep], pix[..., 0], pix[..., 1], pid, stamps)
    if disc and j == num_dashes - 1:
      good &= canvas.clear(b[rep], pix[:, -1, 0], pix[:, -1, 1], pid)
    cum = np.cumsum((weight * good).reshape(-1, k), 1)
    found = cum[:, -1] > 0
    pick = rng.random(idx.size) * cum[:, -1]
    rows = (np.arange(idx.size) * k + (cum <= pick[:, None]).sum(1))[found]
    g = idx[found]
    canvas.draw(b[g], pix[rows, :, 0], pix[rows, :, 1], pid, stamps[rows], on)
    pos[g] = pts[rows, -1]
    heading[g] = h[rows]
    ok[idx[~found]] = False
  end = np.floor(pos + 0.5).astype(np.int64)
  if disc:
    canvas.reserve(b[ok], end[ok, 0], end[ok, 1], pid)
  return ok, end


def _draw_batch(rng, batch, cfg):
  """Draws `batch` images. Returns (canvas, ok `[batch]`, ends `[batch, 2 paths, 2 ends, 2]`)."""
  size = cfg['image_size']
  canvas = _Canvas(batch, size, pad=cfg['dash_length'] + cfg['gap'] + 2)
  ends = np.zeros((batch, 2, 2, 2), np.int64)  # path, (start, end), (y, x) in canvas coordinates
  b = np.arange(batch)
  lo = 2 * cfg['seed_distance']
  lo, hi = (lo, size - lo) if size - 2 * lo > 0 else (1, size - 1)
  ok, ends[:, 0, 0] = _start(canvas, rng, b, 1, lo, hi, disc=True)
  live = b[ok]
  found, point = _start(
    canvas, rng, live, 2, 0, 0, around=ends[live, 0, 0], distance=cfg['seed_distance'], disc=True
  )
  ends[live, 1, 0] = point
  ok[live[~found]] = False
  for path in (0, 1):
    live = b[ok]
    grown, end = _grow(
      canvas,
      rng,
      live,
      path + 1,
      ends[live, path, 0],
      cfg['contour_length'],
      cfg['dash_length'],
      cfg['gap'],
      cfg['continuity'],
      disc=True,
    )
    ends[live, path, 1] = end
    ok[live[~grown]] = False
  live = b[ok]
  for k in range(cfg['num_distractors']):
    pid = 3 + k
    started, point = _start(canvas, rng, live, pid, 1, size - 1)
    _grow(
      canvas,
      rng,
      live[started],
      pid,
      point[started],
      cfg['distractor_length'],
      cfg['dash_length'],
      cfg['gap'],
      cfg['continuity'],
      disc=False,
    )
  return canvas, ok, ends


def _config(
  contour_length,
  num_distractors,
  distractor_length,
  dash_length,
  gap,
  continuity,
  seed_distance,
  image_size,
) -> dict:
  """Checked generation settings, with LRA's defaults filled in."""
  if contour_length < 2:
    raise ValueError(f'contour_length must be >= 2 (LRA: 6, 9, 14), got {contour_length}')
  if distractor_length is None:
    distractor_length = max(contour_length // 3, 1)
  if num_distractors is None:
    num_distractors = 20 // distractor_length
  checks = [
    ('distractor_length', distractor_length, 1),
    ('num_distractors', num_distractors, 0),
    ('dash_length', dash_length, 1),
    ('gap', gap, 0),
    ('seed_distance', seed_distance, 4),
    ('image_size', image_size, 16),
  ]
  for name, value, low in checks:
    if int(value) != value or value < low:
      raise ValueError(f'{name} must be an integer >= {low}, got {value}')
  if not continuity >= 1.0:
    raise ValueError(f'continuity must be >= 1.0 (LRA: 1.0), got {continuity}')
  most = np.iinfo(np.int16).max - 2  # path ids are int16
  if num_distractors > most:
    raise ValueError(f'num_distractors must be <= {most}, got {num_distractors}')
  return {
    'contour_length': int(contour_length),
    'num_distractors': int(num_distractors),
    'distractor_length': int(distractor_length),
    'dash_length': int(dash_length),
    'gap': int(gap),
    'continuity': float(continuity),
    'seed_distance': int(seed_distance),
    'image_size': int(image_size),
  }


def generate(
  num_examples: int,
  seed: Union[int, Sequence[int]],
  contour_length: int = 14,
  num_distractors: Optional[int] = None,
  distractor_length: Optional[int] = None,
  dash_length: int = 2,
  gap: int = 1,
  continuity: float = 1.0,
  seed_distance: int = 7,
  image_size: int = IMAGE_SIZE,
  with_discs: bool = False,
  progress: Optional[str] = None,
):
  """Draws Pathfinder images, deterministically from `seed`.

  Args:
    num_examples: how many images.
    seed: seed of a `np.random.default_rng` (an int or a sequence of ints).
    contour_length: dashes per target path (LRA: 6 easy, 9 intermediate, 14 hard).
    num_distractors: distractor paths (default 20 // distractor_length, as LRA).
    distractor_length: dashes per distractor (default contour_length // 3, as LRA).
    dash_length: pixels drawn per dash.
    gap: pixels skipped between dashes (0 draws solid curves).
    continuity: turn angles have density proportional to cos^2(continuity *
      turn); larger is straighter (LRA's 32x32 data: 1.0).
    seed_distance: pixels between the first points of the two target paths.
    image_size: side of the square images.
    with_discs: also return the disc centres.
    progress: a name; if given, prints progress with rate and ETA.

  Returns:
    images: uint8 `[n, image_size, image_size]`, 0 or 255.
    labels: int64 `[n]`, 1 if the two discs are the ends of one path; exactly
      balanced (n // 2 ones when n is even).
    discs (only with `with_discs`): int64 `[n, 2, 2]`, (disc, (row, column)).
  """
  if num_examples < 0:
    raise ValueError(f'num_examples must be >= 0, got {num_examples}')
  cfg = _config(
    contour_length,
    num_distractors,
    distractor_length,
    dash_length,
    gap,
    continuity,
    seed_distance,
    image_size,
  )
  rng = np.random.default_rng(seed)
  labels = rng.permutation(np.arange(num_examples) % 2).astype(np.int64)
  images = np.zeros((num_examples, image_size, image_size), np.uint8)
  discs = np.zeros((num_examples, 2, 2), np.int64)
  done, attempts, start = 0, 0, time.monotonic()
  last_print = start
  while done < num_examples:
    batch = min(_BATCH, max(32, 2 * (num_examples - done)))
    canvas, ok, ends = _draw_batch(rng, batch, cfg)
    marked = rng.integers(0, 2, batch)  # the path whose start gets a disc
    attempts += batch
    if done == 0 and attempts >= 20 * _BATCH and not ok.any():
      raise RuntimeError(f'no image could be drawn in {attempts} attempts; settings {cfg}')
    rows = np.flatnonzero(ok)[: num_examples - done]
    slots = np.arange(done, done + rows.size)
    other = np.where(labels[slots] == 1, marked[rows], 1 - marked[rows])
    centres = np.stack([ends[rows, marked[rows], 0], ends[rows, other, 1]], 1)
    for k in range(2):
      canvas.paint_disc(rows, centres[:, k, 0], centres[:, k, 1])
    images[slots] = canvas.image[rows]
    discs[slots] = centres - canvas.pad
    done += rows.size
    now = time.monotonic()
    if progress and (now - last_print > 10 or done == num_examples):
      last_print = now
      rate = done / max(now - start, 1e-9)
      print(
        f'{progress}: {done}/{num_examples} images, {rate:.0f} images/s, '
        f'{done / attempts:.0%} of attempts kept, ETA {(num_examples - done) / rate:.0f} s',
        flush=True,
      )
  return (images, labels, discs) if with_discs else (images, labels)


def split_path(
  folder: str, split: str, contour_length: int = 14, image_size: int = IMAGE_SIZE
) -> str:
  """`folder/pathfinder{contour_length}_{split}.npz`; `..._{image_size}px_...` for other sizes."""
  size = '' if image_size == IMAGE_SIZE else f'_{image_size}px'
  return os.path.join(folder, f'pathfinder{contour_length}{size}_{split}.npz')


def write_splits(
  folder: str, seed: int = 0, sizes=None, contour_length: int = 14, verbose: bool = True, **kw
) -> List[str]:
  """Writes the `split_path` files of each split; skips files already up to date.

  Each file holds `x` (uint8 `[n, size, size]`), `y` (int64 `[n]`) and
  `settings_json` (uint8 bytes of the JSON generation settings). A file whose
  settings match is left alone (an interrupted run resumes at the first
  missing split); one with other settings is replaced. Each split is drawn
  from its own seed, (seed, crc32 of its name), so the splits are
  independent draws.

  Args:
    folder: output folder (created if missing).
    seed: base seed.
    sizes: {split name: number of images}; default `DEFAULT_SIZES` (LRA's
      160,000 / 20,000 / 20,000, an 80/10/10 split of 200,000).
    contour_length: see `generate`.
    verbose: print the progress of what is generated.
    **kw: other arguments of `generate` (not `with_discs` or `progress`).

  Returns:
    The paths of the split files, in the order of `sizes`.
  """
  sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
  valid = {
    'num_distractors',
    'distractor_length',
    'dash_length',
    'gap',
    'continuity',
    'seed_distance',
    'image_size',
  }
  if set(kw) - valid:
    raise ValueError(f'unknown arguments {sorted(set(kw) - valid)}; valid: {sorted(valid)}')
  defaults = {
    'num_distractors': None,
    'distractor_length': None,
    'dash_length': 2,
    'gap': 1,
    'continuity': 1.0,
    'seed_distance': 7,
    'image_size': IMAGE_SIZE,
  }
  cfg = _config(contour_length=contour_length, **{**defaults, **kw})
  for split, n in sizes.items():
    if not split or not split.replace('_', '').replace('-', '').isalnum():
      raise ValueError(f'split names must be letters, digits, "_" or "-", got {split!r}')
    if n < 0:
      raise ValueError(f'sizes[{split!r}] must be >= 0, got {n}')
  npz_cache.makedirs(folder)
  paths = []
  for split, n in sizes.items():
    path = split_path(folder, split, contour_length, cfg['image_size'])
    paths.append(path)
    split_seed = (int(seed), zlib.crc32(split.encode('utf-8')))
    settings = {'format': _FORMAT, 'seed': int(seed), 'split': split, 'num_examples': int(n), **cfg}
    side = cfg['image_size']
    why = npz_cache.problem(path, settings, {'x': (n, side, side), 'y': (n,)})
    if not why:  # up to date: no message (read at every open)
      continue
    images, labels = generate(
      n, split_seed, progress=f'pathfinder {os.path.basename(path)}' if verbose else None, **cfg
    )
    npz_cache.save_npz(
      path,
      x=images,
      y=labels,
      settings_json=np.frombuffer(json.dumps(settings, sort_keys=True).encode('utf-8'), np.uint8),
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

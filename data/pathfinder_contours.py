"""A numpy generator of Pathfinder-like images (Linsley et al., 2018), with the 32x32
settings of Long Range Arena (Tay et al., 2021); the task is in `data/pathfinder.py`.

Like the original procedure (`snakes2.py` of
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
"""

import time
from typing import Optional, Sequence, Union

import numpy as np

from data import pathfinder_canvas

IMAGE_SIZE = 32
_BATCH = 1024  # images drawn at once
_DIRECTIONS = 24  # candidate directions per dash, one per equal slice of the allowed turns
_START_CANDIDATES = 8  # start points tried at once per image
_START_ROUNDS = 3  # rounds of start points before a path gives up


def _place_start(canvas, rng, b, pid, low, high, around=None, distance=0.0, disc=False):
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


def _grow_path(canvas, rng, b, pid, origin, num_dashes, dash_length, gap, continuity, disc):
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


def _draw_batch(rng, batch, settings):
  """Draws `batch` images. Returns (canvas, ok `[batch]`, ends `[batch, 2 paths, 2 ends, 2]`)."""
  size = settings['image_size']
  canvas = pathfinder_canvas.Canvas(batch, size, pad=settings['dash_length'] + settings['gap'] + 2)
  ends = np.zeros((batch, 2, 2, 2), np.int64)  # path, (start, end), (y, x) in canvas coordinates
  b = np.arange(batch)
  lo = 2 * settings['seed_distance']
  lo, hi = (lo, size - lo) if size - 2 * lo > 0 else (1, size - 1)
  ok, ends[:, 0, 0] = _place_start(canvas, rng, b, 1, lo, hi, disc=True)
  live = b[ok]
  found, point = _place_start(
    canvas,
    rng,
    live,
    2,
    0,
    0,
    around=ends[live, 0, 0],
    distance=settings['seed_distance'],
    disc=True,
  )
  ends[live, 1, 0] = point
  ok[live[~found]] = False
  for path in (0, 1):
    live = b[ok]
    grown, end = _grow_path(
      canvas,
      rng,
      live,
      path + 1,
      ends[live, path, 0],
      settings['contour_length'],
      settings['dash_length'],
      settings['gap'],
      settings['continuity'],
      disc=True,
    )
    ends[live, path, 1] = end
    ok[live[~grown]] = False
  live = b[ok]
  for k in range(settings['num_distractors']):
    pid = 3 + k
    started, point = _place_start(canvas, rng, live, pid, 1, size - 1)
    _grow_path(
      canvas,
      rng,
      live[started],
      pid,
      point[started],
      settings['distractor_length'],
      settings['dash_length'],
      settings['gap'],
      settings['continuity'],
      disc=False,
    )
  return canvas, ok, ends


def checked_settings(
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
  settings = checked_settings(
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
    canvas, ok, ends = _draw_batch(rng, batch, settings)
    marked = rng.integers(0, 2, batch)  # the path whose start gets a disc
    attempts += batch
    if done == 0 and attempts >= 20 * _BATCH and not ok.any():
      raise RuntimeError(f'no image could be drawn in {attempts} attempts; settings {settings}')
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

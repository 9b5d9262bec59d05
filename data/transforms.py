"""Transformed image variants for the LoRA study: rotated, inverted, quantised.

Pure functions on image batches `[batch, height, width]` or `[batch, height,
width, channels]`, integer (values 0..255) or float (values 0..1 unless
`max_value` says otherwise); each returns the same shape and dtype.

    t = get_transform('rotate:90,invert')          # a config string
    images = t(images)

Variants of the report ("Efficient Attention", section 2): 'rotated' (90
degrees), 'inverted', 'quantised' (2 levels) = `VARIANTS`.
"""

import functools
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.scipy import ndimage

Transform = Callable[[jnp.ndarray], jnp.ndarray]


def _max_value(images, max_value: Optional[float]) -> float:
  if max_value is not None:
    return max_value
  return 255.0 if jnp.issubdtype(jnp.asarray(images).dtype, jnp.integer) else 1.0


def _cast_like(x: jnp.ndarray, images) -> jnp.ndarray:
  dtype = jnp.asarray(images).dtype
  if jnp.issubdtype(dtype, jnp.integer):
    info = jnp.iinfo(dtype)
    x = jnp.clip(jnp.round(x), info.min, info.max)
  return x.astype(dtype)


def rotate(images, degrees: float = 90.0) -> jnp.ndarray:
  """Rotate counter-clockwise about the image centre.

  Multiples of 90 degrees are exact (`rot90`, square images keep their shape);
  other angles resample bilinearly with zero fill, keeping the shape.
  """
  images = jnp.asarray(images)
  if images.ndim not in (3, 4):
    raise ValueError(f'images must be [batch, h, w] or [batch, h, w, c], got {images.shape}')
  if float(degrees) % 90 == 0:
    return jnp.rot90(images, k=int(degrees // 90) % 4, axes=(1, 2))
  h, w = images.shape[1:3]
  theta = math.radians(degrees)
  rows, cols = jnp.meshgrid(
    jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing='ij'
  )
  cy, cx = (h - 1) / 2, (w - 1) / 2
  # Output pixel (r, c) reads the input at the inversely rotated position.
  src_r = cy + (rows - cy) * math.cos(theta) + (cols - cx) * math.sin(theta)
  src_c = cx - (rows - cy) * math.sin(theta) + (cols - cx) * math.cos(theta)
  x = images.astype(jnp.float32)
  x3 = x if x.ndim == 4 else x[..., None]

  def one(img):  # [h, w]
    return ndimage.map_coordinates(img, [src_r, src_c], order=1, mode='constant', cval=0.0)

  flat = jnp.moveaxis(x3, 3, 1).reshape((-1, h, w))
  out = jax.vmap(one)(flat)
  out = jnp.moveaxis(out.reshape((x3.shape[0], x3.shape[3], h, w)), 1, 3)
  return _cast_like(out if x.ndim == 4 else out[..., 0], images)


def invert(images, max_value: Optional[float] = None) -> jnp.ndarray:
  """max_value - x (255 - x for integer images, 1 - x for floats)."""
  images = jnp.asarray(images)
  m = _max_value(images, max_value)
  return _cast_like(m - images.astype(jnp.float32), images)


def quantise(images, levels: int = 2, max_value: Optional[float] = None) -> jnp.ndarray:
  """Snap intensities to `levels` evenly spaced values in [0, max_value].

  levels=2 binarises at max_value / 2.
  """
  if levels < 2:
    raise ValueError(f'quantise needs levels >= 2, got {levels}')
  images = jnp.asarray(images)
  m = _max_value(images, max_value)
  x = images.astype(jnp.float32) / m
  q = jnp.clip(jnp.floor(x * levels), 0, levels - 1)
  return _cast_like(q * (m / (levels - 1)), images)


TRANSFORMS = {'rotate': rotate, 'invert': invert, 'quantise': quantise}
VARIANTS = {
  'mnist': 'none',
  'rotated': 'rotate:90',
  'inverted': 'invert',
  'quantised': 'quantise:2',
}


def get_transform(spec: str) -> Transform:
  """A transform from a config string.

  'none' / '' (identity), 'rotate:DEGREES', 'invert', 'quantise:LEVELS', a
  variant name from `VARIANTS`, or a comma-separated chain applied left to right.
  """
  spec = VARIANTS.get(spec, spec)
  steps = []
  for item in (s.strip() for s in spec.split(',')):
    if item in ('', 'none'):
      continue
    name, _, arg = item.partition(':')
    if name not in TRANSFORMS:
      raise ValueError(
        f'unknown transform {name!r} in {spec!r}; valid: '
        f'{", ".join(TRANSFORMS)}, none, or a variant: {", ".join(VARIANTS)}'
      )
    if name == 'rotate':
      steps.append(functools.partial(rotate, degrees=float(arg or 90)))
    elif name == 'quantise':
      steps.append(functools.partial(quantise, levels=int(arg or 2)))
    else:
      if arg:
        raise ValueError(f"'invert' takes no argument, got {item!r}")
      steps.append(invert)

  def transform(images):
    for step in steps:
      images = step(images)
    return images

  return transform

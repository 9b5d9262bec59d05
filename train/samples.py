"""Sample grids and occluded completions of a causal pixel model, as PNG files.

write_samples(model, params, rng, workdir, image_shape=(28, 28), images=real)
# -> {'samples': '<workdir>/samples.png', 'completion': '<workdir>/samples_completion.png'}
"""

import io
import os
from typing import Dict, Optional, Tuple

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np

from efficient_attn.models.sampling import make_sampler


def images_to_tokens(images) -> jnp.ndarray:
  """uint8-valued images `[batch, h, w]` (or `[..., 1]`) -> raster-order tokens `[batch, h*w]`."""
  images = np.asarray(images)
  if images.ndim == 4:
    images = images[..., 0]
  return jnp.asarray(images.reshape(images.shape[0], -1), jnp.int32)


def tokens_to_images(tokens, shape: Tuple[int, int]) -> np.ndarray:
  """Tokens `[batch, h*w]` -> uint8 images `[batch, h, w]`."""
  tokens = np.asarray(tokens)
  return np.clip(tokens, 0, 255).astype(np.uint8).reshape((tokens.shape[0],) + tuple(shape))


def tile(images, ncols: Optional[int] = None, pad: int = 1, pad_value: int = 128) -> np.ndarray:
  """`[n, h, w]` -> one `[rows * (h + pad) - pad, ncols * (w + pad) - pad]` mosaic."""
  images = np.asarray(images)
  n, h, w = images.shape
  ncols = ncols or int(np.ceil(np.sqrt(n)))
  nrows = -(-n // ncols)
  out = np.full((nrows * (h + pad) - pad, ncols * (w + pad) - pad), pad_value, images.dtype)
  for i, img in enumerate(images):
    r, c = divmod(i, ncols)
    out[r * (h + pad) : r * (h + pad) + h, c * (w + pad) : c * (w + pad) + w] = img
  return out


def save_grid(path: str, images, ncols: Optional[int] = None, zoom: int = 1) -> str:
  """Write uint8 images `[n, h, w]` as one grayscale PNG grid, each pixel a
  `zoom` x `zoom` block; returns the path."""
  from matplotlib import image  # pylint: disable=g-import-not-at-top  (every run imports this module)

  grid = np.kron(tile(images, ncols), np.ones((zoom, zoom), np.uint8))
  png = io.BytesIO()
  image.imsave(png, grid, cmap='gray', vmin=0, vmax=255, format='png')
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(png.getvalue())
  return os.fspath(path)


def occlude(images, rows: int, value: int = 0) -> np.ndarray:
  """Images with every row from `rows` on set to `value` (what the model is shown)."""
  out = np.array(images, copy=True)
  out[:, rows:] = value
  return out


def write_samples(
  model,
  params,
  rng,
  out_dir: str,
  *,
  image_shape: Tuple[int, int],
  num_samples: int = 16,
  temperature: float = 1.0,
  images: Optional[np.ndarray] = None,
  rows: Optional[int] = None,
  prefix: str = 'samples',
) -> Dict[str, str]:
  """Unconditional samples and (given real `images`) occluded completions as PNGs.

  The hook for a trainer's evaluation: writes `<out_dir>/<prefix>.png` (a grid
  of `num_samples` samples; none when 0) and, if `images` `[n, h, w]` uint8 is given,
  `<out_dir>/<prefix>_completion.png`: rows of originals, occluded inputs (top
  `rows` rows kept, default half) and completions. Returns {name: path}.
  """
  h, w = image_shape
  length = h * w
  zoom = max(1, 64 // max(h, w))
  rng_u, rng_c = jax.random.split(rng)
  paths = {}
  sampler = None
  if num_samples > 0:
    sampler = make_sampler(model, num_samples, length)
    tokens = sampler(params, rng_u, temperature=temperature)
    paths['samples'] = save_grid(
      os.path.join(out_dir, f'{prefix}.png'), tokens_to_images(tokens, image_shape), zoom=zoom
    )
  if images is not None and len(images):
    images = np.asarray(images)
    images = (images[..., 0] if images.ndim == 4 else images)[:, :h, :w]
    rows = h // 2 if rows is None else rows
    n = images.shape[0]
    completer = (
      sampler if sampler is not None and n == num_samples else make_sampler(model, n, length)
    )
    done = completer(
      params,
      rng_c,
      temperature=temperature,
      prefix=images_to_tokens(images),
      prefix_length=rows * w,
    )
    grid = np.concatenate([images, occlude(images, rows), tokens_to_images(done, image_shape)])
    paths['completion'] = save_grid(
      os.path.join(out_dir, f'{prefix}_completion.png'), grid, ncols=n, zoom=zoom
    )
  return paths

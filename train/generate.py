"""Autoregressive pixel generation with a `CausalTransformer`: sampling, completion, PNGs.

    sampler = make_sampler(model, batch=16, length=784)        # jit-compiled
    tokens = sampler(params, rng, temperature=1.0)              # unconditional
    tokens = sampler(params, rng, prefix=real, prefix_length=14 * 28)  # top 14 rows given
    save_grid('samples.png', tokens_to_images(tokens, (28, 28)))

The sampler runs a `lax.scan` over positions; each step feeds the previous
token through the model in decode mode (softmax: key/value cache; linear and
random-feature attention: the constant-size recurrent state), so a sequence
of n tokens costs n single-token steps.
"""
import os
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

Sampler = Callable[..., jnp.ndarray]


def sample_logits(rng, logits: jnp.ndarray, temperature) -> jnp.ndarray:
  """Categorical sample from softmax(logits / temperature); argmax where temperature <= 0.

  logits `[batch, vocab]`; temperature a float or a traced scalar -> `[batch]` int32.
  """
  greedy = jnp.argmax(logits, axis=-1)
  t = jnp.asarray(temperature, jnp.float32)
  sampled = jax.random.categorical(rng, logits / jnp.maximum(t, 1e-6), axis=-1)
  return jnp.where(t > 0, sampled, greedy).astype(jnp.int32)


def init_cache(decoder, params, batch: int, length: int):
  """The empty decode cache of `decoder` (a model with decode=True) for `length` tokens."""
  _, variables = decoder.apply({'params': params}, jnp.zeros((batch, length), jnp.int32),
                               mutable=['cache'])
  return variables['cache']


def make_step(model) -> Callable[..., Tuple[jnp.ndarray, Any]]:
  """`step(params, cache, token [batch]) -> (logits [batch, vocab], cache)`, one position."""
  decoder = model.clone(decode=True)

  def step(params, cache, token):
    logits, variables = decoder.apply({'params': params, 'cache': cache}, token[:, None],
                                      mutable=['cache'])
    return logits[:, 0], variables['cache']

  return step


def sample_fn(model, batch: int, length: Optional[int] = None) -> Callable[..., jnp.ndarray]:
  """The jit-compiled sampling loop (AOT-compilable with `.lower(...).compile()`).

  `run(params, rng, temperature, prefix, prefix_length)` with temperature a
  float32 scalar, prefix int32 `[batch, length]`, prefix_length an int32
  scalar -> tokens `[batch, length]` int32. See `make_sampler`.
  """
  length = length or model.max_length
  decoder = model.clone(decode=True)
  step = make_step(model)

  @jax.jit
  def run(params, rng, temperature, prefix, prefix_length):
    cache = init_cache(decoder, params, batch, length)

    def body(carry, t):
      cache, prev, rng = carry
      logits, cache = step(params, cache, prev)
      rng, sub = jax.random.split(rng)
      token = sample_logits(sub, logits, temperature)
      token = jnp.where(t < prefix_length, prefix[:, t], token)
      return (cache, token, rng), token

    start = jnp.full((batch,), model.start_token, jnp.int32)
    _, tokens = jax.lax.scan(body, (cache, start, rng), jnp.arange(length))
    return tokens.T

  return run


def sampler_args(batch: int, length: int, temperature=1.0, prefix=None, prefix_length=0):
  """Checked, padded arguments (temperature, prefix, prefix_length) of `sample_fn`'s run."""
  if prefix is None:
    prefix = jnp.zeros((batch, length), jnp.int32)
  prefix = jnp.asarray(prefix, jnp.int32)
  if prefix.shape[0] != batch or prefix.shape[1] < prefix_length:
    raise ValueError(f'prefix {prefix.shape} must be [{batch}, >= {prefix_length}]')
  prefix = jnp.pad(prefix[:, :length], ((0, 0), (0, length - min(prefix.shape[1], length))))
  return jnp.float32(temperature), prefix, jnp.int32(prefix_length)


def make_sampler(model, batch: int, length: Optional[int] = None) -> Sampler:
  """A jit-compiled sampler for `batch` sequences of `length` tokens.

  Args:
    model: a `CausalTransformer` (its decode flag is set here); its mechanism
      needs a decoding form.
    batch: number of sequences sampled together.
    length: tokens per sequence (default model.max_length).
  Returns:
    `sampler(params, rng, temperature=1.0, prefix=None, prefix_length=0)`
    -> tokens `[batch, length]` int32. Positions < prefix_length copy
    `prefix` `[batch, >= prefix_length]` (teacher forcing through the same
    steps); the rest are sampled. temperature and prefix_length may change
    between calls without recompiling.
  """
  length = length or model.max_length
  run = sample_fn(model, batch, length)

  def sampler(params, rng, temperature=1.0, prefix=None, prefix_length=0):
    return run(params, rng, *sampler_args(batch, length, temperature, prefix, prefix_length))

  return sampler


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
    out[r * (h + pad):r * (h + pad) + h, c * (w + pad):c * (w + pad) + w] = img
  return out


def save_grid(path: str, images, ncols: Optional[int] = None, zoom: int = 1) -> str:
  """Write uint8 images `[n, h, w]` as one grayscale PNG grid, each pixel a
  `zoom` x `zoom` block; returns the path."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  grid = np.kron(tile(images, ncols), np.ones((zoom, zoom), np.uint8))
  plt.imsave(path, grid, cmap='gray', vmin=0, vmax=255)
  return path


def occlude(images, rows: int, value: int = 0) -> np.ndarray:
  """Images with every row from `rows` on set to `value` (what the model is shown)."""
  out = np.array(images, copy=True)
  out[:, rows:] = value
  return out


def write_samples(model, params, rng, out_dir: str, *, image_shape: Tuple[int, int],
                  num_samples: int = 16, temperature: float = 1.0,
                  images: Optional[np.ndarray] = None, rows: Optional[int] = None,
                  prefix: str = 'samples') -> Dict[str, str]:
  """Unconditional samples and (given real `images`) occluded completions as PNGs.

  The hook for a trainer's evaluation: writes `<out_dir>/<prefix>.png` (a grid
  of `num_samples` samples) and, if `images` `[n, h, w]` uint8 is given,
  `<out_dir>/<prefix>_completion.png`: rows of originals, occluded inputs (top
  `rows` rows kept, default half) and completions. Returns {name: path}.
  """
  h, w = image_shape
  length = h * w
  zoom = max(1, 64 // max(h, w))
  rng_u, rng_c = jax.random.split(rng)
  sampler = make_sampler(model, num_samples, length)
  tokens = sampler(params, rng_u, temperature=temperature)
  paths = dict(samples=save_grid(os.path.join(out_dir, f'{prefix}.png'),
                                 tokens_to_images(tokens, image_shape), zoom=zoom))
  if images is not None:
    images = np.asarray(images)
    images = (images[..., 0] if images.ndim == 4 else images)[:, :h, :w]
    rows = h // 2 if rows is None else rows
    n = images.shape[0]
    completer = sampler if n == num_samples else make_sampler(model, n, length)
    done = completer(params, rng_c, temperature=temperature,
                     prefix=images_to_tokens(images), prefix_length=rows * w)
    grid = np.concatenate([images, occlude(images, rows), tokens_to_images(done, image_shape)])
    paths['completion'] = save_grid(os.path.join(out_dir, f'{prefix}_completion.png'),
                                    grid, ncols=n, zoom=zoom)
  return paths

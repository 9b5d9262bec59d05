"""Autoregressive sampling from a causal model in decoding mode.

    sampler = make_sampler(model, batch=16, length=784)        # jit-compiled
    tokens = sampler(params, rng, temperature=1.0)              # unconditional
    tokens = sampler(params, rng, prefix=real, prefix_length=14 * 28)  # top 14 rows given

The sampler runs a `lax.scan` over positions; each step feeds the previous
token through the model in decode mode (`efficient_attn.layers.decoding`: a key/value
cache for exact attention, the constant-size recurrent state for linear and
random-feature attention), so a sequence of n tokens costs n single-token
steps. The model is a `CausalTransformer` (any module with `decode`,
`start_token` and `max_length` works).
"""

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp

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
  _, variables = decoder.apply(
    {'params': params}, jnp.zeros((batch, length), jnp.int32), mutable=['cache']
  )
  return variables['cache']


def make_step(model) -> Callable[..., Tuple[jnp.ndarray, Any]]:
  """`step(params, cache, token [batch]) -> (logits [batch, vocab], cache)`, one position."""
  decoder = model.clone(decode=True)

  def step(params, cache, token):
    logits, variables = decoder.apply(
      {'params': params, 'cache': cache}, token[:, None], mutable=['cache']
    )
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

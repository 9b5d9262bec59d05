"""Sampling from a causal model: the next-token sampler, and the decoding steps.

    token = sample_logits(rng, logits, temperature=0.8, top_k=40, top_p=0.95)   # [batch]
    sampler = make_sampler(model, batch=16, length=784)        # jit-compiled
    tokens = sampler(params, rng, temperature=1.0)              # unconditional
    tokens = sampler(params, rng, prefix=real, prefix_length=14 * 28)  # top 14 rows given

`sample_logits` draws the next token as Hugging Face's and MaxText's samplers do, in
this order: the logits divided by the temperature (0: the argmax), then cut to the
`top_k` most likely tokens (`top_k_logits`), then to the fewest most likely tokens whose
probability reaches `top_p` (`top_p_logits`, the nucleus of Holtzman et al. 2020); ties
at either cut are kept. `efficient_attn.models.generate` uses it, with a prompt, an end
token and rows that stop on their own.

`make_sampler` is the fixed-length loop: a `lax.scan` over positions; each step feeds the
previous token through the model in decode mode (`efficient_attn.layers.decoding`: a
key/value cache for exact attention, the constant-size recurrent state for linear and
random-feature attention), so a sequence of n tokens costs n single-token steps, the
given prefix included. The model is a `CausalTransformer` (any module with `decode`,
`start_token` and `max_length` works).
"""

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp


def top_k_logits(logits: jnp.ndarray, top_k: int) -> jnp.ndarray:
  """`logits` `[..., vocab]` with every token outside the `top_k` most likely set to -inf
  (ties with the k-th kept; `top_k` >= the vocabulary keeps them all). `top_k` is a
  Python int >= 1."""
  if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
    raise ValueError(
      f'top_k={top_k!r} is not valid; valid: an int >= 1 (0: no cut, in sample_logits)'
    )
  if top_k >= logits.shape[-1]:
    return logits
  kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
  return jnp.where(logits >= kth, logits, -jnp.inf)


def top_p_logits(logits: jnp.ndarray, top_p) -> jnp.ndarray:
  """`logits` `[..., vocab]` cut to the nucleus: the fewest most likely tokens whose
  probabilities (softmax of `logits`) add up to at least `top_p`, every other token -inf.
  A token as likely as the least likely one kept is kept too. `top_p` in (0, 1], a float
  or a traced scalar; 1 keeps every token."""
  if isinstance(top_p, (int, float)) and not 0.0 < top_p <= 1.0:
    raise ValueError(f'top_p={top_p!r} is not valid; it must be in (0, 1] (1: no cut)')
  p = jnp.asarray(top_p, jnp.float32)
  x = logits.astype(jnp.float32)
  probs = jax.nn.softmax(x, axis=-1)
  order = jnp.argsort(-x, axis=-1)
  ranked = jnp.take_along_axis(probs, order, axis=-1)
  before = jnp.cumsum(ranked, axis=-1) - ranked  # the probability of the tokens above each
  kept = before < p  # the first token always (0 < p)
  least = jnp.min(
    jnp.where(kept, jnp.take_along_axis(x, order, axis=-1), jnp.inf), -1, keepdims=True
  )
  return jnp.where((x >= least) | (p >= 1.0), logits, -jnp.inf)


def sample_logits(rng, logits: jnp.ndarray, temperature, top_k: int = 0, top_p=1.0) -> jnp.ndarray:
  """A token per row from softmax(logits / temperature), cut to `top_k` (0: no cut) and
  then to `top_p` (1: no cut; see the module docstring); the argmax where temperature <= 0.

  logits `[batch, vocab]`; temperature and top_p floats or traced scalars; top_k a Python
  int -> `[batch]` int32.
  """
  if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
    raise ValueError(f'top_k={top_k!r} is not valid; valid: an int >= 0 (0: no cut)')
  greedy = jnp.argmax(logits, axis=-1)
  t = jnp.asarray(temperature, jnp.float32)
  scaled = logits.astype(jnp.float32) / jnp.maximum(t, 1e-6)
  if top_k:
    scaled = top_k_logits(scaled, top_k)
  if not (isinstance(top_p, (int, float)) and top_p == 1.0):  # a traced top_p: always cut
    scaled = top_p_logits(scaled, top_p)
  sampled = jax.random.categorical(rng, scaled, axis=-1)
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


def make_sampler(model, batch: int, length: Optional[int] = None) -> Callable[..., jnp.ndarray]:
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

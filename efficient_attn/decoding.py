"""Decoding forms: how a causal attention layer generates one token at a time.

`MultiHeadAttention(decode=True)` keeps one `state` per layer in the flax
'cache' collection and advances it with the form of its mechanism:

  * recurrent: mechanisms whose Linen module defines
      `init_state(batch, heads, head_dim, v_dim, dtype) -> state` and
      `step(state, q_t, k_t, v_t) -> (state, out_t)`
    (linear, rfa, performer): the (S, Z) state of "Transformers are RNNs",
    constant size, O(1) per token;
  * kv_cache: exact softmax ('softmax', 'softmax_chunked'; 'local' with its
    window): keys and values `[batch, max_length, heads, dim]` written at the
    current index. `kv_cache_attention` visits only the cache blocks that hold
    visible keys, so a step at position t costs O(t) (O(window) for 'local').

Both are wrapped as `DecodeForm(init, step)` with one signature, so the layer
handles every mechanism with the same few lines.
"""
import math
from typing import Any, Callable, NamedTuple, Optional, Tuple

import jax.numpy as jnp
from jax import lax

from efficient_attn import masking
from efficient_attn import registry

KV_CACHE_MECHANISMS: Tuple[str, ...] = ('softmax', 'softmax_chunked', 'local')
KV_BLOCK = 64  # keys per block visited by `kv_cache_attention`


class KVCache(NamedTuple):
  """Keys `[batch, L, heads, dk]` and values `[batch, L, heads, dv]`; L is the
  context length rounded up to a multiple of the block size."""
  keys: jnp.ndarray
  values: jnp.ndarray


class DecodeForm(NamedTuple):
  """`init(batch, max_length, heads, head_dim, v_dim, dtype) -> state` and
  `step(state, q_t, k_t, v_t, index) -> (state, out_t)`, tokens `[batch, 1, heads, dim]`."""
  init: Callable[..., Any]
  step: Callable[..., Tuple[Any, jnp.ndarray]]


def has_recurrent_form(mechanism_cls) -> bool:
  """Whether a mechanism module class defines `init_state` and `step`."""
  return callable(getattr(mechanism_cls, 'init_state', None)) and callable(
      getattr(mechanism_cls, 'step', None))


def decodable_mechanisms() -> Tuple[str, ...]:
  """Registered mechanisms with a decoding form."""
  names = []
  for name, spec in registry.MECHANISMS.items():
    if name in KV_CACHE_MECHANISMS:
      names.append(name)
      continue
    try:
      if has_recurrent_form(spec.module):
        names.append(name)
    except ImportError:  # a mechanism file not written yet
      pass
  return tuple(names)


def decode_form(name: str, mech) -> DecodeForm:
  """The decoding form of mechanism `name` given its (child) module `mech`.

  Raises ValueError naming the mechanisms that can decode.
  """
  if name in KV_CACHE_MECHANISMS:
    scale, window = getattr(mech, 'scale', None), None
    if name == 'local':
      window = mech.window

    def kv_step(cache, q_t, k_t, v_t, index):
      keys = lax.dynamic_update_slice_in_dim(cache.keys, k_t.astype(cache.keys.dtype),
                                             index, axis=1)
      values = lax.dynamic_update_slice_in_dim(
          cache.values, v_t.astype(cache.values.dtype), index, axis=1)
      out = kv_cache_attention(q_t[:, 0], keys, values, index, scale=scale, window=window)
      return KVCache(keys, values), out[:, None]

    return DecodeForm(init_kv_cache, kv_step)
  if has_recurrent_form(type(mech)):
    def init(batch, max_length, heads, head_dim, v_dim, dtype):
      del max_length, dtype  # constant size; accumulate in float32
      return mech.init_state(batch, heads, head_dim, v_dim)

    def step(state, q_t, k_t, v_t, index):
      del index
      return mech.step(state, q_t, k_t, v_t)

    return DecodeForm(init, step)
  raise ValueError(f'mechanism {name!r} has no decoding form (decode=True); mechanisms '
                   f'that can decode: {", ".join(decodable_mechanisms())}')


def init_kv_cache(batch: int, max_length: int, heads: int, head_dim: int, v_dim: int,
                  dtype=jnp.float32, block: int = KV_BLOCK) -> KVCache:
  """An empty cache with room for `max_length` tokens (rounded up to `block`)."""
  length = -(-max_length // block) * block
  return KVCache(jnp.zeros((batch, length, heads, head_dim), dtype),
                 jnp.zeros((batch, length, heads, v_dim), dtype))


def kv_cache_attention(q: jnp.ndarray, keys: jnp.ndarray, values: jnp.ndarray, index,
                       *, scale: Optional[float] = None, window: Optional[int] = None,
                       block: int = KV_BLOCK) -> jnp.ndarray:
  """Exact softmax attention of one query over cached keys lo..index.

  Online softmax over the cache blocks that hold visible keys (a `fori_loop`
  with traced bounds), so the cost grows with the position, not the cache size.

  Args:
    q: `[batch, heads, dk]`, the query at position `index`.
    keys: `[batch, L, heads, dk]`, values `[batch, L, heads, dv]`, L a multiple
      of `block`, filled up to `index` inclusive.
    index: int scalar (may be traced).
    scale: score scale, default 1/sqrt(dk).
    window: causal local attention: keys index - window < j <= index.
  Returns:
    `[batch, heads, dv]` in the values' dtype (computed in float32 or wider).
  """
  b, length, h, dk = keys.shape
  if length % block:
    raise ValueError(f'cache length {length} is not a multiple of block={block}')
  compute = jnp.promote_types(q.dtype, jnp.float32)
  q = q.astype(compute) * (1.0 / math.sqrt(dk) if scale is None else scale)
  lo = 0 if window is None else jnp.maximum(index - window + 1, 0)
  neg = masking.big_neg(compute)

  def body(j, carry):
    m, l, acc = carry
    kb = lax.dynamic_slice_in_dim(keys, j * block, block, axis=1).astype(compute)
    vb = lax.dynamic_slice_in_dim(values, j * block, block, axis=1).astype(compute)
    pos = j * block + jnp.arange(block)
    valid = (pos >= lo) & (pos <= index)
    s = jnp.where(valid, jnp.einsum('bhd,bkhd->bhk', q, kb), neg)
    m_new = jnp.maximum(m, s.max(axis=-1))
    p = jnp.exp(s - m_new[..., None]) * valid
    corr = jnp.exp(m - m_new)
    return (m_new, l * corr + p.sum(-1),
            acc * corr[..., None] + jnp.einsum('bhk,bkhd->bhd', p, vb))

  init = (jnp.full((b, h), neg, compute), jnp.zeros((b, h), compute),
          jnp.zeros((b, h, values.shape[-1]), compute))
  _, l, acc = lax.fori_loop(lo // block, index // block + 1, body, init)
  return (acc / l[..., None]).astype(values.dtype)

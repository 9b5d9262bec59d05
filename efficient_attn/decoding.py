"""Decoding forms: how a causal attention layer generates one token at a time.

`MultiHeadAttention(decode=True)` keeps one `state` per layer in the flax
'cache' collection and advances it with the form its mechanism declares
(`registry.Mechanism.decode`):

  * 'recurrent' (linear, rfa, performer): the mechanism's `init_state` / `step`,
    e.g. the (S, Z) state of "Transformers are RNNs": constant size, O(1) per
    token;
  * 'kv_cache' (softmax, softmax_chunked, local): keys and values `[batch,
    capacity, heads, dim]` written at the current index; `kv_cache_attention`
    visits only the cache blocks that hold visible keys, so a step at position
    t costs O(t) (O(window) for local attention).

Both are wrapped as `DecodeForm(init, step)` with one signature, so the layer
handles every mechanism with the same few lines.

Capacity: the cache holds as many tokens as the call that created it; a step
past that capacity stops with a ValueError (see `efficient_attn.checks`)
instead of overwriting the last slot. Create the cache with a dummy input as
long as the longest sequence you will decode.

Grouped-query attention (Ainslie et al. 2023): keys and values may have fewer
heads than the queries (`heads` a multiple of `kv_heads`; query head i reads
key/value head i // (heads / kv_heads)). The key/value cache then holds only
the kv heads, and so does the recurrent state of a mechanism whose state
depends on keys and values alone (`registry.Mechanism.grouped_state`): the
decoding memory shrinks by the group factor.
"""
from typing import Any, Callable, NamedTuple, Optional, Tuple

import jax.numpy as jnp
from jax import lax

from efficient_attn import checks
from efficient_attn import online_softmax
from efficient_attn import registry
from efficient_attn.softmax import default_scale

KV_BLOCK = 64  # keys per block visited by `kv_cache_attention`


class KVCache(NamedTuple):
  """Keys `[batch, L, kv_heads, dk]` and values `[batch, L, kv_heads, dv]`; L is
  the capacity."""
  keys: jnp.ndarray
  values: jnp.ndarray


class DecodeForm(NamedTuple):
  """`init(batch, capacity, heads, head_dim, v_dim, dtype) -> state` and
  `step(state, q_t, k_t, v_t, index) -> (state, out_t)`, tokens `[batch, 1, heads, dim]`."""
  init: Callable[..., Any]
  step: Callable[..., Tuple[Any, jnp.ndarray]]


def decodable_mechanisms() -> Tuple[str, ...]:
  """Registered mechanisms with a decoding form."""
  return registry.names_where(lambda m: bool(m.decode))


def decode_form(decl: registry.Mechanism, o: registry.Options,
                recurrent_step: Optional[Callable[..., Any]] = None) -> DecodeForm:
  """The decoding form of a mechanism declaration with options `o`.

  Args:
    decl, o: the declaration and its resolved options.
    recurrent_step: for 'recurrent' mechanisms, `step(state, q_t, k_t, v_t, index)
      -> (state, out_t)` bound to the layer's parameters.

  Raises ValueError naming the mechanisms that can decode.
  """
  if decl.decode == 'kv_cache':
    scale, window = o.get('scale'), decl.kv_window(o)

    def kv_step(cache, q_t, k_t, v_t, index):
      capacity = cache.keys.shape[1]
      checks.runtime_check(index < capacity, 'decoding step at position {} is past the '
                           'cache capacity of {} tokens; create the cache with an input as '
                           'long as the longest sequence', index, capacity)
      keys = lax.dynamic_update_slice_in_dim(cache.keys, k_t.astype(cache.keys.dtype),
                                             index, axis=1)
      values = lax.dynamic_update_slice_in_dim(
          cache.values, v_t.astype(cache.values.dtype), index, axis=1)
      out = kv_cache_attention(q_t[:, 0], keys, values, index, scale=scale, window=window)
      return KVCache(keys, values), out[:, None]

    return DecodeForm(init_kv_cache, kv_step)
  if decl.decode == 'recurrent':
    def init(batch, capacity, heads, head_dim, v_dim, dtype):
      del capacity, dtype  # constant size; accumulate in float32
      return decl.init_state(o, batch=batch, heads=heads, head_dim=head_dim, v_dim=v_dim)

    def step(state, q_t, k_t, v_t, index):
      return recurrent_step(state, q_t, k_t, v_t, index)

    return DecodeForm(init, step)
  raise ValueError(f'mechanism {decl.name!r} has no decoding form (decode=True); mechanisms '
                   f'that can decode: {", ".join(decodable_mechanisms())}')


def init_kv_cache(batch: int, capacity: int, heads: int, head_dim: int, v_dim: int,
                  dtype=jnp.float32) -> KVCache:
  """An empty cache with room for `capacity` tokens of `heads` (kv) heads."""
  return KVCache(jnp.zeros((batch, capacity, heads, head_dim), dtype),
                 jnp.zeros((batch, capacity, heads, v_dim), dtype))


def kv_cache_attention(q: jnp.ndarray, keys: jnp.ndarray, values: jnp.ndarray, index,
                       *, scale: Optional[float] = None, window: Optional[int] = None,
                       block: int = KV_BLOCK) -> jnp.ndarray:
  """Exact softmax attention of one query over cached keys lo..index.

  Online softmax (`efficient_attn.online_softmax`) over the cache blocks that
  hold visible keys (a `fori_loop` with traced bounds), so the cost grows with
  the position, not the cache size.

  Args:
    q: `[batch, heads, dk]`, the query at position `index`.
    keys: `[batch, L, kv_heads, dk]`, values `[batch, L, kv_heads, dv]`, filled
      up to `index` inclusive; `heads` a multiple of `kv_heads` (grouped-query
      attention: query head i reads kv head i // (heads / kv_heads)).
    index: int scalar (may be traced).
    scale: score scale, default 1/sqrt(dk).
    window: causal local attention: keys index - window < j <= index.
    block: keys per visited block (the last block of a cache whose length is
      not a multiple overlaps its predecessor; overlapped keys count once).
  Returns:
    `[batch, heads, dv]` in the values' dtype (computed in float32 or wider).
  """
  b, length, hk, dk = keys.shape
  h = q.shape[1]
  if h % hk:
    raise ValueError(f'{h} query heads are not a multiple of the cache\'s {hk} key/value heads')
  block = min(block, length)
  compute = jnp.promote_types(q.dtype, jnp.float32)
  q = q.astype(compute) * default_scale(dk, scale)
  q = q.reshape(b, hk, h // hk, dk)                       # the group as the query axis
  lo = 0 if window is None else jnp.maximum(index - window + 1, 0)

  def body(j, state):
    start = jnp.minimum(j * block, length - block)
    kb = lax.dynamic_slice_in_dim(keys, start, block, axis=1).astype(compute)
    vb = lax.dynamic_slice_in_dim(values, start, block, axis=1).astype(compute)
    pos = start + jnp.arange(block)
    valid = (pos >= jnp.maximum(lo, j * block)) & (pos <= index)
    scores = jnp.einsum('bngd,bknd->bngk', q, kb)
    return online_softmax.update(state, scores, valid, vb)

  state = lax.fori_loop(lo // block, index // block + 1, body,
                        online_softmax.init(b, hk, h // hk, values.shape[-1], compute))
  return online_softmax.finish(state).reshape(b, h, -1).astype(values.dtype)

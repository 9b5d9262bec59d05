"""Decoding forms: how a causal attention layer generates one token at a time.

`MultiHeadAttention(decode=True)` keeps one `state` per layer in the flax
'cache' collection and advances it with the form its mechanism declares
(`registry.Mechanism.decode`):

  * 'recurrent' (linear, rfa, performer): the mechanism's `init_state` / `step`,
    e.g. the (S, Z) state of "Transformers are RNNs": constant size, O(1) per
    token;
  * 'kv_cache' (softmax, softmax_chunked): keys and values `[batch, capacity,
    heads, dim]` written at the current index; `kv_cache_attention` visits
    only the cache blocks that hold visible keys, so a step at position t
    costs O(t);
  * 'kv_cache' with a window (`registry.Mechanism.kv_window`; local): a ring
    buffer of the last `window` keys and values (`window_kv_cache`): constant
    size, O(window) per token.

Both are wrapped as `DecodeForm(init, step)` with one signature, so the layer
handles every mechanism with the same few lines.

Capacity: a full key/value cache holds as many tokens as the call that
created it; a step past that capacity stops with a ValueError (see
`efficient_attn.ops.traced_checks`) instead of overwriting the last slot. Create the
cache with a dummy input as long as the longest sequence you will decode. A
ring buffer of the whole window has no such limit (what else the layer caches,
e.g. the super projection's raw values, keeps its own).

Grouped-query attention (Ainslie et al. 2023): keys and values may have fewer
heads than the queries (`heads` a multiple of `kv_heads`; query head i reads
key/value head i // (heads / kv_heads)). The key/value cache then holds only
the kv heads, and so does the recurrent state of a mechanism whose state
depends on keys and values alone (`registry.Mechanism.grouped_state`): the
decoding memory shrinks by the group factor.
"""

from typing import Any, Callable, NamedTuple, Optional, Tuple

from jax import lax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops import online_softmax
from efficient_attn.ops import traced_checks
from efficient_attn.ops.scaled_dot_product import default_scale

KV_BLOCK = 64  # keys per block visited by `kv_cache_attention`


class KVCache(NamedTuple):
  """Keys `[batch, L, kv_heads, dk]` and values `[batch, L, kv_heads, dv]`; L is
  the capacity, or the slots of a ring buffer (`window_kv_cache`)."""

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


def decode_form(
  decl: registry.Mechanism,
  options: registry.Options,
  recurrent_step: Optional[Callable[..., Any]] = None,
) -> DecodeForm:
  """The decoding form of a mechanism declaration with options `options`.

  Args:
    decl, options: the declaration and its resolved options.
    recurrent_step: for 'recurrent' mechanisms, `step(state, q_t, k_t, v_t, index)
      -> (state, out_t)` bound to the layer's parameters.

  Raises ValueError naming the mechanisms that can decode.
  """
  if decl.decode == 'kv_cache':
    scale, window = options.get('scale'), decl.kv_window(options)
    if window is not None:
      return window_kv_cache(window, scale=scale)

    def kv_step(cache, q_t, k_t, v_t, index):
      _check_capacity(index, cache.keys.shape[1])
      cache = _write(cache, k_t, v_t, index)
      out = kv_cache_attention(q_t[:, 0], cache.keys, cache.values, index, scale=scale)
      return cache, out[:, None]

    return DecodeForm(init_kv_cache, kv_step)
  if decl.decode == 'recurrent':

    def init(batch, capacity, heads, head_dim, v_dim, dtype):
      del capacity, dtype  # constant size; accumulate in float32
      return decl.init_state(options, batch=batch, heads=heads, head_dim=head_dim, v_dim=v_dim)

    def step(state, q_t, k_t, v_t, index):
      return recurrent_step(state, q_t, k_t, v_t, index)

    return DecodeForm(init, step)
  raise ValueError(
    f'mechanism {decl.name!r} has no decoding form (decode=True); mechanisms '
    f'that can decode: {", ".join(decodable_mechanisms())}'
  )


def init_kv_cache(
  batch: int, capacity: int, heads: int, head_dim: int, v_dim: int, dtype=jnp.float32
) -> KVCache:
  """An empty cache with room for `capacity` tokens of `heads` (kv) heads."""
  return KVCache(
    jnp.zeros((batch, capacity, heads, head_dim), dtype),
    jnp.zeros((batch, capacity, heads, v_dim), dtype),
  )


def window_kv_cache(window: int, *, scale: Optional[float] = None) -> DecodeForm:
  """Causal local attention's decoding form: a ring buffer of the last `window` tokens.

  The step at position t attends to keys t - window < j <= t (the causal band of
  `mechanisms.local.local_attention`, the current token included), so the cache
  needs only `slots` = min(capacity, window) slots: the token at position t is
  written at slot t mod slots, over the token t - slots, which has left the
  window. Softmax does not depend on the order of its keys, so a step attends to
  the filled slots 0..min(t, slots - 1) as they lie. Keys are cached as the layer
  gives them (rotated at their own position when rotary applies), so wrapping
  around changes nothing. Cache `[batch, slots, kv_heads, dim]`; constant size
  and O(window) per token, with no limit on the position, except for a cache
  created by a call shorter than the window (slots < window): it never wraps and
  refuses a step past its capacity, as the full cache does.

  Args:
    window: the window w >= 1 (`registry.Mechanism.kv_window`).
    scale: score scale, default 1/sqrt(dk).
  """

  def init(batch, capacity, heads, head_dim, v_dim, dtype=jnp.float32):
    return init_kv_cache(batch, min(capacity, window), heads, head_dim, v_dim, dtype)

  def step(cache, q_t, k_t, v_t, index):
    slots = cache.keys.shape[1]
    if slots < window:  # wrapping would overwrite a key still in the window
      _check_capacity(index, slots)
    cache = _write(cache, k_t, v_t, index % slots)
    out = kv_cache_attention(
      q_t[:, 0], cache.keys, cache.values, jnp.minimum(index, slots - 1), scale=scale
    )
    return cache, out[:, None]

  return DecodeForm(init, step)


def _check_capacity(index, capacity: int) -> None:
  traced_checks.runtime_check(
    index < capacity,
    'decoding step at position {} is past the '
    'cache capacity of {} tokens; create the cache with an input as '
    'long as the longest sequence',
    index,
    capacity,
  )


def _write(cache: KVCache, k_t, v_t, slot) -> KVCache:
  """`cache` with one token's key and value `[batch, 1, kv_heads, dim]` at `slot`."""
  return KVCache(
    *(
      lax.dynamic_update_slice_in_dim(c, x.astype(c.dtype), slot, axis=1)
      for c, x in ((cache.keys, k_t), (cache.values, v_t))
    )
  )


def kv_cache_attention(
  q: jnp.ndarray,
  keys: jnp.ndarray,
  values: jnp.ndarray,
  index,
  *,
  scale: Optional[float] = None,
  window: Optional[int] = None,
  block: int = KV_BLOCK,
) -> jnp.ndarray:
  """Exact softmax attention of one query over cached keys lo..index.

  Online softmax (`efficient_attn.ops.online_softmax`) over the cache blocks that
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
  q = q.reshape(b, hk, h // hk, dk)  # the group as the query axis
  lo = 0 if window is None else jnp.maximum(index - window + 1, 0)

  def body(j, state):
    start = jnp.minimum(j * block, length - block)
    kb = lax.dynamic_slice_in_dim(keys, start, block, axis=1).astype(compute)
    vb = lax.dynamic_slice_in_dim(values, start, block, axis=1).astype(compute)
    pos = start + jnp.arange(block)
    valid = (pos >= jnp.maximum(lo, j * block)) & (pos <= index)
    scores = jnp.einsum('bngd,bknd->bngk', q, kb)
    return online_softmax.update(state, scores, valid, vb)

  state = lax.fori_loop(
    lo // block,
    index // block + 1,
    body,
    online_softmax.init(b, hk, h // hk, values.shape[-1], compute),
  )
  return online_softmax.finish(state).reshape(b, h, -1).astype(values.dtype)

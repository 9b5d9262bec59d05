"""Decoding forms: how a causal attention layer runs tokens from a cache.

`MultiHeadAttention(decode=True)` keeps one `state` per layer in the flax
'cache' collection and advances it with the form its mechanism declares
(`registry.Mechanism.decode`), by one token (a step) or by n tokens in one
parallel pass (a prefill), which leaves the state the n steps would:

  * 'recurrent' (linear, rfa, performer, the gated recurrences): the mechanism's
    `init_state` / `step` (one token) and `prefill` (n tokens from the state: its
    chunk form from `initial_state`, or the steps in a scan), e.g. the (S, Z)
    state of "Transformers are RNNs": constant size, O(1) per token;
  * 'kv_cache' (softmax, softmax_chunked): keys and values `[batch, capacity,
    heads, dim]` written at the current index; `kv_cache_attention` visits
    only the cache blocks that hold visible keys, so a step at position t
    costs O(t), and a prefill of n tokens attends causally over the cache and
    its own block;
  * 'kv_cache' with a window (`registry.Mechanism.kv_window`; local): a ring
    buffer of the last `window` keys and values (`window_kv_cache`): constant
    size, O(window) per token.

Each is a `DecodeForm(init, step)` with one signature, so the layer handles every
mechanism with the same few lines. A call's tokens come with a `Tokens`: where they
stand in the stream and in their rows' packed documents (`efficient_attn.layers.cache`
tracks them). A key/value cache keeps each slot's document and a token reads only the
slots of its own (docs/design.md, "Documents"); a padding token writes nothing and
reads nothing (its output is 0). A recurrent mechanism gets the call's raw segment ids
in `ctx.documents` and resets its own state.

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
  """Keys `[batch, L, kv_heads, dk]`, values `[batch, L, kv_heads, dv]` and the document
  of each slot's token `[batch, L]` int32 (its document's index in the row, as
  `Tokens.documents`; -1: an empty slot or a padding token's). L is the capacity, or the
  slots of a ring buffer (`window_kv_cache`)."""

  keys: jnp.ndarray
  values: jnp.ndarray
  documents: jnp.ndarray


class Tokens(NamedTuple):
  """Where the n >= 1 tokens of one decoding call stand (n = 1: a step; n > 1: a prefill).

  Attributes:
    index: int32 scalar, the cache index of the first token (its place in the stream).
    documents: `[batch, n]` int32, each token's document in its row: the row's
      `segments.document_index`, continued across calls; -1 for a padding token.
    segment_ids: `[batch, n]` int32, the call's raw segment ids (0: padding), or None
      (the row's one document goes on).
    positions: `[batch, n]` int32, each token's position in its document (rotary).
    first_visible: int32 scalar, the earliest cache index a token of the call may read
      (where the earliest of its rows' current documents began).
  """

  index: Any
  documents: jnp.ndarray
  segment_ids: Optional[jnp.ndarray]
  positions: jnp.ndarray
  first_visible: Any


class DecodeForm(NamedTuple):
  """`init(batch, capacity, heads, head_dim, v_dim, dtype) -> state` and
  `step(state, q, k, v, tokens) -> (state, out)`: q `[batch, n, heads, dk]`, k and v
  `[batch, n, kv_heads, d]`, `tokens` a `Tokens`, out `[batch, n, heads, dv]`."""

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
    recurrent_step: for 'recurrent' mechanisms, `step(state, q, k, v, tokens)
      -> (state, out)` bound to the layer's parameters (the mechanism's `step` for one
      token, its `prefill` for more).

  Raises ValueError naming the mechanisms that can decode.
  """
  if decl.decode == 'kv_cache':
    scale, window = options.get('scale'), decl.kv_window(options)
    if window is not None:
      return window_kv_cache(window, scale=scale)
    return full_kv_cache(scale=scale, attention=decl.kv_cache_attention(options))
  if decl.decode == 'recurrent':

    def init(batch, capacity, heads, head_dim, v_dim, dtype):
      # constant size, accumulated in float32; or a cache of `capacity` tokens
      sized = {'capacity': capacity, 'dtype': dtype} if decl.state_capacity else {}
      return decl.init_state(
        options, batch=batch, heads=heads, head_dim=head_dim, v_dim=v_dim, **sized
      )

    if recurrent_step is None:
      raise ValueError(f'mechanism {decl.name!r} decodes recurrently: it needs recurrent_step')
    return DecodeForm(init, recurrent_step)
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
    jnp.full((batch, capacity), -1, jnp.int32),
  )


def _written(k, v, documents):
  """A call's keys and values as a cache stores them: a padding token's are zero (it writes
  nothing, whatever it holds: a NaN in it reaches no other token)."""
  real = (documents >= 0)[..., None, None]
  return jnp.where(real, k, jnp.zeros((), k.dtype)), jnp.where(real, v, jnp.zeros((), v.dtype))


def full_kv_cache(
  *, scale: Optional[float] = None, attention: Optional[Callable[..., Any]] = None
) -> DecodeForm:
  """Exact softmax attention's decoding form: every key and value, a slot per position.

  A call of n tokens at cache index i writes slots i..i+n-1, then its queries attend to
  the slots up to their own position, of their own document (`attention`, with
  `kv_cache_attention`'s arguments: a mechanism's own, `Mechanism.kv_cache_attention`;
  None: `kv_cache_attention`)."""
  attend = kv_cache_attention if attention is None else attention

  def step(cache, q, k, v, tokens):
    n = q.shape[1]
    _check_capacity(tokens.index + n - 1, cache.keys.shape[1])
    k, v = _written(k, v, tokens.documents)
    cache = KVCache(
      *(
        lax.dynamic_update_slice_in_dim(c, x.astype(c.dtype), tokens.index, axis=1)
        for c, x in zip(cache, (k, v, tokens.documents))
      )
    )
    out = attend(
      q,
      cache.keys,
      cache.values,
      query_times=tokens.index + jnp.arange(n),
      query_documents=tokens.documents,
      key_documents=cache.documents,
      scale=scale,
      first=tokens.first_visible,
    )
    return cache, out

  return DecodeForm(init_kv_cache, step)


def window_kv_cache(window: int, *, scale: Optional[float] = None) -> DecodeForm:
  """Causal local attention's decoding form: a ring buffer of the last `window` tokens.

  The token at position t attends to keys t - window < j <= t (the causal band of
  `mechanisms.local.local_attention`, the current token included), so the cache
  needs only `slots` = min(capacity, window) slots: the token at position t is
  kept in slot t mod slots, over the token t - slots, which has left the
  window. A call of n tokens attends over the slots and its own keys (each slot's
  position follows from the cache index), then keeps its last min(n, slots) tokens.
  Keys are cached as the layer gives them (rotated at their own position when rotary
  applies), so wrapping around changes nothing. Cache `[batch, slots, kv_heads, dim]`;
  constant size and O(window) per token, with no limit on the position, except for a
  cache created by a call shorter than the window (slots < window): it never wraps and
  refuses a token past its capacity, as the full cache does.

  Args:
    window: the window w >= 1 (`registry.Mechanism.kv_window`).
    scale: score scale, default 1/sqrt(dk).
  """

  def init(batch, capacity, heads, head_dim, v_dim, dtype=jnp.float32):
    return init_kv_cache(batch, min(capacity, window), heads, head_dim, v_dim, dtype)

  def step(cache, q, k, v, tokens):
    slots, n, i = cache.keys.shape[1], q.shape[1], tokens.index
    if slots < window:  # wrapping would overwrite a key still in the window
      _check_capacity(i + n - 1, slots)
    k, v = _written(k, v, tokens.documents)
    times = i + jnp.arange(n)
    slot_times = i - 1 - jnp.mod(i - 1 - jnp.arange(slots), slots)  # the last write of each
    out = kv_cache_attention(
      q,
      *(jnp.concatenate([c, x.astype(c.dtype)], 1) for c, x in zip(cache[:2], (k, v))),
      query_times=times,
      key_times=jnp.concatenate([slot_times, times]),
      query_documents=tokens.documents,
      key_documents=jnp.concatenate([cache.documents, tokens.documents], 1),
      window=window,
      scale=scale,
    )
    kept = min(n, slots)  # the call's last tokens, each in its own slot
    where = jnp.mod(times[n - kept :], slots)
    cache = KVCache(
      *(
        c.at[:, where].set(x[:, n - kept :].astype(c.dtype))
        for c, x in zip(cache, (k, v, tokens.documents))
      )
    )
    return cache, out

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


def kv_cache_attention(
  q: jnp.ndarray,
  keys: jnp.ndarray,
  values: jnp.ndarray,
  *,
  query_times,
  key_times=None,
  query_documents: Optional[jnp.ndarray] = None,
  key_documents: Optional[jnp.ndarray] = None,
  window: Optional[int] = None,
  scale: Optional[float] = None,
  first=0,
  block: int = KV_BLOCK,
) -> jnp.ndarray:
  """Exact softmax attention of n queries over cached keys, each reading the keys at or
  before its own position (within `window`), of its own document.

  Online softmax (`efficient_attn.ops.online_softmax`) over blocks of keys; over a full
  cache (`key_times` None: slot j holds position j) only the blocks that may hold a
  visible key are visited (a `fori_loop` with traced bounds, from `first` to the last
  query's position), so a step's cost grows with its position, not the cache size.

  Args:
    q: `[batch, n, heads, dk]`.
    keys: `[batch, L, kv_heads, dk]`, values `[batch, L, kv_heads, dv]`; `heads` a
      multiple of `kv_heads` (grouped-query attention: query head i reads kv head
      i // (heads / kv_heads)).
    query_times: `[n]` int, each query's position (may be traced).
    key_times: `[L]` int, each key's position; None: slot j holds position j.
    query_documents, key_documents: `[batch, n]` and `[batch, L]` int, the document of
      each query and key (-1: a key no query reads, a query that reads none); None: one.
    window: causal local attention: keys t - window < j <= t.
    scale: score scale, default 1/sqrt(dk).
    first: with `key_times` None, no key before this position is visible (may be traced).
    block: keys per visited block (the last block of a cache whose length is
      not a multiple overlaps its predecessor; overlapped keys count once).
  Returns:
    `[batch, n, heads, dv]` in the values' dtype (computed in float32 or wider); 0 for a
    query that reads no key.
  """
  b, length, hk, dk = keys.shape
  n, h = q.shape[1], q.shape[2]
  if h % hk:
    raise ValueError(f'{h} query heads are not a multiple of the cache\'s {hk} key/value heads')
  g = h // hk
  block = min(block, length)
  compute = jnp.promote_types(q.dtype, jnp.float32)
  q = q.astype(compute) * default_scale(dk, scale)
  # [b, hk, g * n, dk]: the group and the queries as one query axis.
  q = q.reshape(b, n, hk, g, dk).transpose(0, 2, 3, 1, 4).reshape(b, hk, g * n, dk)
  query_times = jnp.asarray(query_times)
  lo_block: Any  # traced where the first visible key is, else a Python int
  hi_block: Any
  if key_times is None:
    lo = jnp.asarray(first)
    if window is not None:
      lo = jnp.maximum(lo, jnp.min(query_times) - window + 1)
    lo_block, hi_block = jnp.maximum(lo, 0) // block, jnp.max(query_times) // block + 1
  else:
    lo_block, hi_block = 0, -(-length // block)

  def body(j, state):
    start = jnp.minimum(j * block, length - block)
    kb, vb = (
      lax.dynamic_slice_in_dim(x, start, block, axis=1).astype(compute) for x in (keys, values)
    )
    slot = start + jnp.arange(block)
    times = slot if key_times is None else lax.dynamic_slice_in_dim(key_times, start, block)
    visible = (slot >= j * block)[None] & (times[None] <= query_times[:, None])  # [n, block]
    if window is not None:
      visible = visible & (times[None] > query_times[:, None] - window)
    visible = visible[None]
    if query_documents is not None:
      docs = lax.dynamic_slice_in_dim(key_documents, start, block, axis=1)[:, None]
      visible = visible & (docs == query_documents[..., None]) & (docs >= 0)
    visible = jnp.broadcast_to(visible[:, None, None], (b, 1, g, n, block))
    scores = jnp.einsum('bhqd,bkhd->bhqk', q, kb)
    return online_softmax.update(state, scores, visible.reshape(b, 1, g * n, block), vb)

  state = lax.fori_loop(
    lo_block, hi_block, body, online_softmax.init(b, hk, g * n, values.shape[-1], compute)
  )
  out = online_softmax.finish(state).reshape(b, hk, g, n, -1).transpose(0, 3, 1, 2, 4)
  return out.reshape(b, n, h, -1).astype(values.dtype)

"""Forgetting Attention's math (Lin et al. 2025, "Forgetting Transformer: Softmax
Attention with a Forget Gate"): causal softmax attention whose scores carry the log of
the forget gates between key and query,

    F_i = sum_{l <= i} log f_l,   o_i = sum_{j <= i} softmax_j(q_i . k_j * scale + F_i - F_j) v_j,

f_t = sigmoid(x_t w_f + b_f) one scalar per token and head. The bias F_i - F_j is a query
term plus a key term, so the blocked (flash) form adds it per block
(`efficient_attn.ops.flash`'s `bias`); here are the cumulative sums, the dense form (the
n x n scores, float64-checkable) and the decoding cache.

Shapes: q, k `[batch, length, heads, dk]`, v `[batch, length, heads, dv]`, log f and F
`[batch, length, heads]`. F is float32 (or wider) whatever q's dtype: a padded token's
log f counts as 0 (it decays nothing), so a padded or packed row equals its documents
alone.
"""

from typing import NamedTuple, Optional

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import masking
from efficient_attn.ops import online_softmax
from efficient_attn.ops import traced_checks
from efficient_attn.ops.scaled_dot_product import masked_softmax

KV_BLOCK = 64  # cache slots per block a decoding call visits (layers.decoding's)


def cumulative(log_forget, real=None, start=None):
  """F `[b, n, h]` = start + the running sum of log f over the tokens, float32 (or wider);
  real `[b, n]` bool or None: a padded token adds 0. start `[b, h]` or None (0)."""
  log_forget = jnp.asarray(log_forget)
  log_forget = log_forget.astype(jnp.promote_types(log_forget.dtype, jnp.float32))
  if real is not None:
    log_forget = jnp.where(real[..., None], log_forget, 0.0)
  total = jnp.cumsum(log_forget, axis=1)
  return total if start is None else total + start[:, None].astype(total.dtype)


def dense_attention(q, k, v, forget, *, scale: float, key_padding=None, documents=None):
  """The definition with its n x n scores: `[b, n, h, dv]` in the compute dtype (float32,
  or float64 where q is). forget: F `[b, n, h]` (`cumulative`); key_padding `[b, n]` bool
  or None; documents a `masking.document_pair` or None (a query sees its document's keys)."""
  compute = jnp.promote_types(q.dtype, jnp.float32)
  forget = forget.astype(compute)
  s = jnp.einsum('bqhd,bkhd->bhqk', q.astype(compute) * scale, k.astype(compute))
  bias = jnp.swapaxes(forget, 1, 2)
  s = s + (bias[..., :, None] - bias[..., None, :])
  n = q.shape[1]
  valid = masking.causal_mask(n, n)[None, None]
  if key_padding is not None:
    valid = valid & key_padding[:, None, None, :]
  if documents is not None:
    valid = valid & masking.same_document(documents)
  w, _ = masked_softmax(s, valid)
  return jnp.einsum('bhqk,bkhd->bqhd', w, v.astype(compute))


class Cache(NamedTuple):
  """The decoding state: keys `[b, h, L, dk]`, values `[b, h, L, dv]` (head-major, as a
  recurrent state's), each slot's F `[b, L, h]` (float32) and document `[b, L]` int32
  (-1: empty or padding); the running F `[b, h]` after the last token; `filled` (int32
  scalar, the next slot); `last_id` `[b]` (the raw segment id of the last real token, 0:
  none yet) and `begun` `[b]` (documents begun). L, the capacity, is the longest stream
  it holds."""

  keys: jnp.ndarray
  values: jnp.ndarray
  forget: jnp.ndarray
  documents: jnp.ndarray
  total: jnp.ndarray
  filled: jnp.ndarray
  last_id: jnp.ndarray
  begun: jnp.ndarray


def init_cache(batch: int, capacity: int, heads: int, dk: int, dv: int, dtype=jnp.float32):
  """An empty `Cache` for `capacity` tokens; keys and values in `dtype`, F in float32."""
  zeros = lambda *shape: jnp.zeros(shape, dtype)
  return Cache(
    zeros(batch, heads, capacity, dk),
    zeros(batch, heads, capacity, dv),
    jnp.zeros((batch, capacity, heads), jnp.float32),
    jnp.full((batch, capacity), -1, jnp.int32),
    jnp.zeros((batch, heads), jnp.float32),
    jnp.zeros((), jnp.int32),
    jnp.zeros((batch,), jnp.int32),
    jnp.zeros((batch,), jnp.int32),
  )


def _documents(cache: Cache, segment_ids: Optional[jnp.ndarray], n: int):
  """(documents `[b, n]` of the call's tokens, -1 for padding; last_id; begun): a real token
  whose id differs from the row's last real token's begins a document (docs/design.md,
  "Documents"); None: every token continues the row's current document."""
  if segment_ids is None:
    ids = jnp.where(cache.last_id == 0, 1, cache.last_id)
    ids = jnp.broadcast_to(ids[:, None], (ids.shape[0], n))
  else:
    ids = jnp.asarray(segment_ids, jnp.int32)
  real = ids != 0
  last = lax.cummax(jnp.where(real, jnp.arange(n), -1), axis=1)
  last_id = jnp.where(
    last >= 0, jnp.take_along_axis(ids, jnp.maximum(last, 0), 1), cache.last_id[:, None]
  )
  previous = jnp.concatenate([cache.last_id[:, None], last_id[:, :-1]], 1)
  count = cache.begun[:, None] + jnp.cumsum(real & (ids != previous), axis=1, dtype=jnp.int32)
  return jnp.where(real, jnp.maximum(count - 1, 0), -1), last_id[:, -1], count[:, -1]


def decode(cache: Cache, q, k, v, log_forget, *, scale: float, segment_ids=None):
  """n >= 1 tokens through the cache: (cache after, out `[b, n, h, dv]` in v's dtype), as the
  parallel form gives them. q, k `[b, n, h, dk]`, v `[b, n, h, dv]`, log_forget `[b, n, h]`,
  segment_ids `[b, n]` (0: padding, which writes nothing and reads nothing) or None.
  Exact: online softmax over the blocks of slots up to the last token's (`_attend`), so a
  step at position t costs O(t), not O(capacity)."""
  b, n = q.shape[:2]
  capacity = cache.keys.shape[2]
  traced_checks.runtime_check(
    cache.filled + n <= capacity,
    'decoding step at position {} is past the cache capacity of {} tokens; create the '
    'cache with an input as long as the longest sequence',
    cache.filled + n - 1,
    capacity,
  )
  documents, last_id, begun = _documents(cache, segment_ids, n)
  real = documents >= 0
  forget = cumulative(log_forget, real, cache.total)
  keep = lambda x: jnp.swapaxes(jnp.where(real[..., None, None], x, 0), 1, 2)  # [b, h, n, d]
  put = lambda c, x, axis=1: lax.dynamic_update_slice_in_dim(
    c, x.astype(c.dtype), cache.filled, axis=axis
  )
  cache = Cache(
    put(cache.keys, keep(k), 2),
    put(cache.values, keep(v), 2),
    put(cache.forget, forget),
    put(cache.documents, documents),
    forget[:, -1].astype(jnp.float32),
    cache.filled + n,
    last_id,
    begun,
  )
  times = cache.filled - n + jnp.arange(n)
  return cache, _attend(cache, q, forget, documents, times, scale).astype(v.dtype)


def _attend(cache: Cache, q, forget, documents, times, scale: float, block: int = KV_BLOCK):
  """The queries `[b, n, h, dk]` (F `[b, n, h]`, documents `[b, n]`, positions `times` [n])
  over the cache's slots up to the last query's position, `block` at a time by online
  softmax (the last block of a capacity it does not divide overlaps its predecessor;
  overlapped slots count once): `[b, n, h, dv]`, float32 (or wider)."""
  b, h, capacity, _ = cache.keys.shape
  block = min(block, capacity)
  compute = jnp.promote_types(q.dtype, jnp.float32)
  q = jnp.swapaxes(q.astype(compute) * scale, 1, 2)  # [b, h, n, dk]
  query_forget = jnp.swapaxes(forget.astype(compute), 1, 2)[..., None]  # [b, h, n, 1]

  def body(j, state):
    start = jnp.minimum(j * block, capacity - block)
    part = lambda x, axis: lax.dynamic_slice_in_dim(x, start, block, axis=axis)
    keys, values = part(cache.keys, 2).astype(compute), part(cache.values, 2).astype(compute)
    key_forget = jnp.swapaxes(part(cache.forget, 1), 1, 2).astype(compute)[..., None, :]
    s = jnp.einsum('bhqd,bhkd->bhqk', q, keys) + (query_forget - key_forget)
    slot = start + jnp.arange(block)
    visible = (slot >= j * block)[None] & (slot[None] <= times[:, None])  # [n, block]
    slot_documents = part(cache.documents, 1)[:, None, :]
    same = (slot_documents == documents[..., None]) & (documents[..., None] >= 0)
    return online_softmax.update(
      state, s, (visible[None] & same)[:, None], jnp.swapaxes(values, 1, 2)
    )

  state = online_softmax.init(b, h, q.shape[2], cache.values.shape[-1], compute)
  state = lax.fori_loop(0, jnp.max(times) // block + 1, body, state)
  return jnp.swapaxes(online_softmax.finish(state), 1, 2)

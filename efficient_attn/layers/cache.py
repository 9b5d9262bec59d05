"""The decoding cache of a multi-head attention layer, whichever Flax API holds it.

The Linen layer keeps it in the 'cache' collection, the NNX layer as `nnx.Cache`
attributes; both create it with `init_cache` and advance it with `decode`, under
flax's names where flax has the same thing (`CACHE_NAMES`). A call advances it by
its n >= 1 tokens: one (a step) or several (a prefill, one parallel pass that leaves
the cache the n steps would). The mechanism's decoding form
(`efficient_attn.layers.decoding`) is what a call runs.

Packed rows: a call may carry its tokens' segment ids `[batch, n]` (0 is padding). A
row whose id differs from its last real token's starts a new document
(docs/design.md, "Documents"); `track` keeps, per row, where its documents stand
(`Documents`), so that a key/value cache reads only the slots of a token's own
document and rotary positions restart at each document. Without segment ids a row
is one document.
"""

from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.layers import decoding
from efficient_attn.ops import rotary
from efficient_attn.ops import traced_checks

CACHE_NAMES = (
  'cache_index',
  'cached_key',
  'cached_value',
  'cached_key_documents',
  'cached_state',
  'cached_raw_values',
  'cached_documents',
)

# The packed-rows bookkeeping of a decoding cache: each cached key's document and each row's
# `Documents` (the layer's), and the causal model's `Documents` of its positions.
DOCUMENT_NAMES = ('cached_key_documents', 'cached_documents', 'documents')


class Documents(NamedTuple):
  """Where each row of a decoding cache stands in its packed documents, `[batch]` int32
  each: `last_id`, the segment id of its last real token (0: none yet); `begun`, the
  documents begun in it; `start`, the cache index at which its current document began
  (positions count from there)."""

  last_id: jnp.ndarray
  begun: jnp.ndarray
  start: jnp.ndarray


def init_documents(batch: int) -> Documents:
  """A row that has seen no token."""
  return Documents(*(jnp.zeros((batch,), jnp.int32) for _ in range(3)))


def track(
  documents: Documents, segment_ids: Optional[jnp.ndarray], index, n: int
) -> Tuple[Documents, decoding.Tokens]:
  """(documents after, `decoding.Tokens`) of a call of n tokens at cache index `index`
  with segment ids `[batch, n]` (None: every token real, of the row's current document,
  so a call without ids after one with them goes on with the last document).

  Continues `ops.segments.document_index` and `ops.segments.positions` across calls: a
  real token starts a document where its id differs from the row's last real token's;
  a padding token (id 0) belongs to no document (-1) and counts on the position of the
  token before it."""
  if segment_ids is None:  # the row's current document goes on (the first: id 1)
    ids = jnp.where(documents.last_id == 0, 1, documents.last_id)
    ids = jnp.broadcast_to(ids[:, None], (ids.shape[0], n))
  else:
    ids = segment_ids.astype(jnp.int32)
  real = ids != 0
  t = jnp.arange(n)
  last = lax.cummax(jnp.where(real, t, -1), axis=1)  # the last real token at or before t
  last_id = jnp.where(
    last >= 0, jnp.take_along_axis(ids, jnp.maximum(last, 0), 1), documents.last_id[:, None]
  )
  previous = jnp.concatenate([documents.last_id[:, None], last_id[:, :-1]], 1)
  starts = real & (ids != previous)
  count = documents.begun[:, None] + jnp.cumsum(starts, axis=1, dtype=jnp.int32)
  times = index + t
  first = starts | (times == 0)[None]
  start = lax.cummax(jnp.where(first, times[None], documents.start[:, None]), axis=1)
  tokens = decoding.Tokens(
    index=index,
    documents=jnp.where(real, jnp.maximum(count - 1, 0), -1),
    segment_ids=None if segment_ids is None else ids,
    positions=times[None] - start,
    first_visible=jnp.min(start[:, 0]),
  )
  return Documents(last_id[:, -1], count[:, -1], start[:, -1]), tokens


def init_cache(
  form: decoding.DecodeForm,
  *,
  batch: int,
  length: int,
  heads: int,
  head_dim: int,
  dtype: Any,
  super_values: bool,
  v_dim: Optional[int] = None,
) -> Dict[str, Any]:
  """An empty decoding cache for `length` tokens of `heads` (`state_heads`) heads, keys of
  `head_dim` and values of `v_dim` (None: head_dim) features (`HeadLayout`'s qk_dim, v_dim).

  'cache_index' (the next position); 'cached_documents' (`Documents`); the mechanism's
  state: 'cached_key' and 'cached_value' `[batch, slots, heads, head_dim]` for a
  key/value cache (as flax; slots = length, or min(length, window) for a sliding
  window's ring buffer, `decoding.window_kv_cache`) with 'cached_key_documents'
  `[batch, slots]` (each slot's document), 'cached_state' for a recurrent state; and,
  for the super projection, 'cached_raw_values' (the raw values its lower-triangular
  W_A mixes).
  """
  v_dim = v_dim or head_dim
  cache = {'cache_index': jnp.zeros((), jnp.int32), 'cached_documents': init_documents(batch)}
  state = form.init(batch, length, heads, head_dim, v_dim, dtype)
  if isinstance(state, decoding.KVCache):
    cache['cached_key'], cache['cached_value'], cache['cached_key_documents'] = state
  else:
    cache['cached_state'] = state
  if super_values:
    cache['cached_raw_values'] = jnp.zeros((batch, length, heads, v_dim), dtype)
  return cache


def check_batch(cache: Dict[str, Any], batch: int) -> None:
  """ValueError when a call of `batch` rows does not fit the cache's."""
  cached = [
    x for name, value in cache.items() if name != 'cache_index' for x in jax.tree.leaves(value)
  ]  # every one [batch, ...]
  if cached and batch != cached[0].shape[0]:
    raise ValueError(
      f'a decoding step of batch {batch} does not fit the cache, made '
      f'for batch {cached[0].shape[0]} (batch axes flattened); decode with '
      f'the batch the cache was created with'
    )


def decode(
  form: decoding.DecodeForm,
  cache: Dict[str, Any],
  q,
  k,
  v,
  *,
  rotate_scores: bool,
  align_at: Optional[Callable[..., Any]] = None,
  segment_ids=None,
  positions=None,
):
  """n tokens `[batch, n, heads, dim]` through the cache: (new cache, out `[batch, n,
  heads, dv]`), as n steps of one token would leave and give them.

  Raises ValueError when `batch` is not the cache's.

  Args:
    form: the mechanism's `decoding.DecodeForm`.
    cache: from `init_cache`.
    rotate_scores: rotary positions on q and k (keys are cached rotated).
    align_at: the super projection's `align(values, index=i, count=n)`; None otherwise.
    segment_ids: `[batch, n]` int, the tokens' segment ids (checked by the caller), or
      None.
    positions: `[batch, n]` int, the tokens' rotary positions; None: their positions in
      their documents (`track`).
  """
  check_batch(cache, q.shape[0])
  i, n = cache['cache_index'], q.shape[1]
  cache = dict(cache)
  cache['cached_documents'], tokens = track(cache['cached_documents'], segment_ids, i, n)
  if positions is not None:
    tokens = tokens._replace(positions=jnp.asarray(positions, jnp.int32))
  if align_at is not None:
    values = cache['cached_raw_values']
    traced_checks.runtime_check(
      i + n <= values.shape[1],
      'decoding step at position {} is past the super projection\'s context of {} tokens',
      i + n - 1,
      values.shape[1],
    )
    values = lax.dynamic_update_slice_in_dim(values, v.astype(values.dtype), i, axis=1)
    cache['cached_raw_values'] = values
    v = align_at(values, index=i, count=n)
  if 'cached_key' in cache:
    if rotate_scores:  # a recurrent mechanism's rotation is run_mechanism's
      q, k = rotary.rotate(q, tokens.positions), rotary.rotate(k, tokens.positions)
    names = ('cached_key', 'cached_value', 'cached_key_documents')
    state, x = form.step(decoding.KVCache(*(cache[name] for name in names)), q, k, v, tokens)
    cache.update(zip(names, state))
  else:
    cache['cached_state'], x = form.step(cache['cached_state'], q, k, v, tokens)
  cache['cache_index'] = i + n
  return cache, x

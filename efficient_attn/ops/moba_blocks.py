"""MoBA's blocks and their selection (Lu et al. 2025), shared by its forms (`ops.moba`).

`select_blocks` is the rule alone: a query's scores over its blocks in, the blocks it
reads out, its own block forced, future blocks never, the top_k - 1 past blocks of
highest score (ties: the earlier block); any block-sparse attention that picks blocks per
query may use it (e.g. Native Sparse Attention's selection branch, Yuan et al. 2025).
`key_blocks` places key slots in blocks of their documents, `block_means` pools each
block's real keys, and `select_for` scores a query's blocks by q . mean and selects.
Shapes and the meaning of `key_documents` are those of `ops.moba`'s docstring.
"""

from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp


def select_blocks(scores, own, top_k: int, available=None):
  """The blocks a query reads: its own block, forced, and the top_k - 1 past blocks of
  highest score.

  Args:
    scores: float `[..., m]`, the gate score of each of the query's blocks 0 .. m-1 (in
      order; block j < own is past, j > own future).
    own: int `[...]`, the query's own block.
    top_k: k >= 1, the blocks read, the own block included.
    available: bool `[..., m]` or None: blocks that may be picked (e.g. not empty).

  Returns:
    (index, valid): int32 `[..., k']` and bool `[..., k']`, k' = min(top_k, m + 1):
    index[..., 0] is the own block (valid), index[..., 1:] the picked past blocks by
    descending score (ties: the earlier block), valid False where fewer than k' - 1
    past blocks could be picked.
  """
  if top_k < 1:
    raise ValueError(f'select_blocks: top_k={top_k} is not valid; valid: an int >= 1')
  own = jnp.asarray(own, jnp.int32)
  m = scores.shape[-1]
  pickable = jnp.arange(m) < own[..., None]
  if available is not None:
    pickable = pickable & available
  index, valid = [own[..., None]], [jnp.ones(own.shape + (1,), bool)]
  extra = min(top_k - 1, m)
  if extra:
    _, past = lax.top_k(jnp.where(pickable, scores, -jnp.inf), extra)
    index.append(past.astype(jnp.int32))
    valid.append(jnp.take_along_axis(pickable, past, axis=-1))
  return jnp.concatenate(index, -1), jnp.concatenate(valid, -1)


class KeyBlocks(NamedTuple):
  """Where each key slot stands, `[batch, L]` int32 each (from `key_blocks`).

  Attributes:
    documents: the document of each slot (negative: no real key).
    start: the slot of its document's first real token (padding continues the document
      before it; padding before any document counts from slot 0).
    block: its block within the document, (slot - start) // B.
    block_id: a number per (document, block) over the row, consecutive within a
      document: block j of the document that starts at s is block_id[s] + j.
  """

  documents: jnp.ndarray
  start: jnp.ndarray
  block: jnp.ndarray
  block_id: jnp.ndarray


def key_blocks(key_documents, block_size: int) -> KeyBlocks:
  """The `KeyBlocks` of key slots with documents `key_documents` `[batch, L]`."""
  docs = jnp.asarray(key_documents, jnp.int32)
  slot = jnp.arange(docs.shape[-1], dtype=jnp.int32)
  real = docs >= 0
  last_real = lax.cummax(jnp.where(real, slot, -1), axis=docs.ndim - 1)
  before = jnp.concatenate([jnp.full_like(last_real[..., :1], -1), last_real[..., :-1]], -1)
  previous = jnp.where(before >= 0, jnp.take_along_axis(docs, jnp.maximum(before, 0), -1), -1)
  start = lax.cummax(jnp.where(real & (docs != previous), slot, 0), axis=docs.ndim - 1)
  offset = slot - start
  block_id = jnp.cumsum(offset % block_size == 0, axis=-1, dtype=jnp.int32) - 1
  return KeyBlocks(docs, start, offset // block_size, block_id)


def block_means(k, blocks: KeyBlocks):
  """The mean of each block's real keys, float32 (or wider) `[batch, L, heads, d]` indexed
  by block_id, and bool `[batch, L]`: the block holds a real key (else its mean is 0)."""
  b, length = blocks.documents.shape
  real = blocks.documents >= 0
  compute = jnp.promote_types(k.dtype, jnp.float32)
  keys = jnp.where(real[..., None, None], k.astype(compute), 0.0)
  ids = (blocks.block_id + length * jnp.arange(b)[:, None]).reshape(-1)
  total = lambda x: jax.ops.segment_sum(x.reshape((b * length,) + x.shape[2:]), ids, b * length)
  sums = total(keys).reshape(k.shape[:2] + k.shape[2:])
  counts = total(real.astype(compute)).reshape(b, length)
  return sums / jnp.maximum(counts, 1.0)[..., None, None], counts > 0


class Queries(NamedTuple):
  """The queries' places, `[batch, n]` int32 each: slot, document (negative: reads
  nothing), start (its document's first slot), block (its own block in the document) and
  first_id (the block_id of its document's block 0)."""

  slot: jnp.ndarray
  documents: jnp.ndarray
  start: jnp.ndarray
  block: jnp.ndarray
  first_id: jnp.ndarray


def queries_at(blocks: KeyBlocks, slots) -> Queries:
  """The `Queries` at the slots `slots` `[n]` int (each < L)."""
  slots = jnp.broadcast_to(jnp.asarray(slots, jnp.int32), blocks.start.shape[:1] + jnp.shape(slots))
  at = lambda x: jnp.take_along_axis(x, slots, axis=-1)
  start = at(blocks.start)
  return Queries(
    slots,
    at(blocks.documents),
    start,
    at(blocks.block),
    jnp.take_along_axis(blocks.block_id, start, axis=-1),
  )


def select_for(q, queries: Queries, means, nonempty, block_size: int, top_k: int):
  """Each query's blocks, (index, valid) `[batch, n, heads, k']` as `select_blocks`, from
  the gate scores q . mean of its document's blocks 0 .. ceil(L / B) - 1 (no gradient).

  Args:
    q: `[batch, n, heads, d]`; queries: their `Queries`; means, nonempty: `block_means`.
  """
  length = means.shape[1]
  candidates = queries.first_id[..., None] + jnp.arange(-(-length // block_size))  # [b, n, m]
  inside = candidates < length
  candidates = jnp.minimum(candidates, length - 1)
  picked = jax.vmap(lambda m, c: m[c])(lax.stop_gradient(means), candidates)  # [b, n, m, h, d]
  scores = jnp.einsum('bnhd,bnmhd->bnhm', lax.stop_gradient(q).astype(means.dtype), picked)
  available = inside & jax.vmap(lambda x, c: x[c])(nonempty, candidates)
  own = jnp.broadcast_to(queries.block[..., None], scores.shape[:-1])
  return select_blocks(scores, own, top_k, available[:, :, None])


def repeat_heads(x, heads: int):
  """Keys or values `[b, L, kv_heads, d]` repeated to `heads` heads (grouped-query
  attention: query head i reads kv head i // (heads / kv_heads))."""
  if heads % x.shape[2]:
    raise ValueError(f'{heads} query heads are not a multiple of {x.shape[2]} key/value heads')
  return jnp.repeat(x, heads // x.shape[2], axis=2)

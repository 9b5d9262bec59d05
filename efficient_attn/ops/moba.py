"""MoBA, mixture of block attention (Lu et al. 2025): the block selection and two exact forms.

Keys are cut into blocks of B consecutive positions of their document: block j of a
document holds its positions jB .. (j + 1)B - 1, counted from the document's first real
token (so a packed document, or a left-padded row, has the blocks it has alone). A query
at position t, in block c of its document, reads with ONE softmax
  * its own block c, causally (keys at positions <= t), and
  * the top_k - 1 past blocks j < c of highest gate score q_t . mean(K_j), the mean of the
    block's real keys,
never a future block, never another document's keys, never a padded key. The own block
counts in top_k (the reference code, MoonshotAI/MoBA `moba_naive.py`, gives it the gate
score +inf); selection is per query token and per head, ties go to the earlier block
(`lax.top_k`), and a block with no real key is never picked. The gate is a selection:
no gradient flows through it (as in the reference, whose gate is a 0 / -inf mask).

The keys are `key_documents` `[batch, L]` int32 slots: the document index of each key
(`ops.segments.document_index`), negative for a slot that holds no real key (padding, an
empty cache slot). The n queries sit at the consecutive slots `query_start + i`; a query
on a negative slot reads nothing and its output is 0. Self-attention is query_start = 0,
n = L; a decoding call (`mechanisms.moba`) is its tokens' slots in the key/value cache.

Three forms, equal up to float rounding:
  * `tiled_moba` (the default): FlashAttention's tiles, queries `q_chunk` and keys
    `k_chunk` at a time with an online softmax, skipping every key tile that no query
    of the chunk reads: at most softmax_chunked's work, O(q_chunk (k_chunk + L / B) d)
    memory per head and chunk;
  * `gather_moba`: queries in chunks (`lax.map`, rematerialised in the backward pass);
    each query gathers the top_k blocks it reads, B keys each, and takes its softmax
    over those k B keys: O(n k B d) time, independent of L, but every gathered key is
    moved for one query (on a CPU, 15 s for 4K tokens, 8 heads of 64, where the tiles
    take 0.5 s and softmax_chunked 0.8 s);
  * `dense_moba`: the `[n, L]` mask of the selection, then one masked softmax (the
    reference: O(n L) memory).
All score the gate in O(n (L / B) d): every query against the means of its document's
blocks.

`select_blocks` is the rule alone (scores of a query's blocks in, its top_k blocks out,
the own block forced, the future excluded), for any block-sparse attention that picks
blocks per query (e.g. Native Sparse Attention's selection branch, Yuan et al. 2025).
"""

from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import online_softmax
from efficient_attn.ops import scaled_dot_product

FORMS = ('tiles', 'gather', 'dense')


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


def _repeat_heads(x, heads: int):
  """Keys or values `[b, L, kv_heads, d]` repeated to `heads` heads (grouped-query
  attention: query head i reads kv head i // (heads / kv_heads))."""
  if heads % x.shape[2]:
    raise ValueError(f'{heads} query heads are not a multiple of {x.shape[2]} key/value heads')
  return jnp.repeat(x, heads // x.shape[2], axis=2)


def dense_moba(q, k, v, key_documents, *, block_size: int, top_k: int, scale: float, query_start=0):
  """MoBA through its dense `[n, L]` mask and one masked softmax (the reference form).

  Args:
    q: `[batch, n, heads, d]` at slots query_start .. query_start + n - 1.
    k: `[batch, L, kv_heads, d]`, v `[batch, L, kv_heads, dv]`.
    key_documents: int `[batch, L]` (see the module docstring).
    block_size: B >= 1; top_k: k >= 1; scale: the score scale.

  Returns:
    `[batch, n, heads, dv]` float32 (or wider); 0 for a query that reads nothing.
  """
  b, n, h, _ = q.shape
  k, v = _repeat_heads(k, h), _repeat_heads(v, h)
  compute = jnp.promote_types(jnp.promote_types(q.dtype, k.dtype), jnp.float32)
  blocks = key_blocks(key_documents, block_size)
  means, nonempty = block_means(k, blocks)
  queries = queries_at(blocks, query_start + jnp.arange(n))
  index, valid = select_for(q, queries, means, nonempty, block_size, top_k)
  ids = jnp.where(valid, queries.first_id[..., None, None] + index, -1)  # [b, n, h, k']
  read = jnp.any(ids[..., None] == blocks.block_id[:, None, None, None, :], axis=-2)
  slot = jnp.arange(k.shape[1])
  same = (blocks.documents[:, None, :] == queries.documents[..., None]) & (
    queries.documents[..., None] >= 0
  )
  allowed = read.transpose(0, 2, 1, 3) & (same & (slot <= queries.slot[..., None]))[:, None]
  s = jnp.einsum('bqhd,bkhd->bhqk', q.astype(compute), k.astype(compute)) * scale
  w, _ = scaled_dot_product.masked_softmax(s, allowed)
  return jnp.einsum('bhqk,bkhd->bqhd', w, v.astype(compute))


def gather_moba(
  q,
  k,
  v,
  key_documents,
  *,
  block_size: int,
  top_k: int,
  scale: float,
  query_start=0,
  q_chunk: int = 16,
):
  """MoBA with each query's blocks gathered, never `[n, L]` (arguments as `dense_moba`).

  The queries run `q_chunk` at a time (`lax.map`; the backward pass recomputes each
  chunk). Each query gathers the k' <= top_k blocks it reads, B keys and values each, and
  takes one masked softmax over those k' B keys. Time O(n k B d + n (L / B) d), memory
  O(q_chunk (k B + L / B) d) per head and chunk.
  """
  b, n, h, d = q.shape
  length = k.shape[1]
  k, v = _repeat_heads(k, h), _repeat_heads(v, h)
  compute = jnp.promote_types(jnp.promote_types(q.dtype, k.dtype), jnp.float32)
  blocks = key_blocks(key_documents, block_size)
  means, nonempty = block_means(k, blocks)
  chunk = min(q_chunk, n)
  chunks = -(-n // chunk)
  pad = chunks * chunk - n
  qs = jnp.pad(q.astype(compute) * scale, ((0, 0), (0, pad), (0, 0), (0, 0)))
  qs = qs.reshape(b, chunks, chunk, h, d).swapaxes(0, 1)  # [chunks, b, c, h, d]
  # [b, h, L + B, d], and the documents [b, L + B]: a block read past the end is padding.
  kt, vt = (
    jnp.pad(x.astype(compute).transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, block_size), (0, 0)))
    for x in (k, v)
  )
  key_docs = jnp.pad(blocks.documents, ((0, 0), (0, block_size)), constant_values=-1)
  within = jnp.arange(block_size)
  # Whole blocks, B consecutive slots each (a slice gather: rows of B d, not single keys).
  take = lambda x, first: lax.dynamic_slice_in_dim(x, first, block_size, axis=0)
  per_head = jax.vmap(jax.vmap(jax.vmap(take, (None, 0))))  # x [b, h, L+B, d], first [b, h, X]
  per_row = jax.vmap(jax.vmap(jax.vmap(take, (None, 0)), (None, 0)))  # x [b, L+B]

  @jax.checkpoint
  def one_chunk(args):
    i, qc = args
    slots = query_start + i * chunk + jnp.arange(chunk)
    on_slot = slots < query_start + n  # the padded queries of the last chunk read nothing
    queries = queries_at(blocks, jnp.minimum(slots, length - 1))
    index, valid = select_for(qc, queries, means, nonempty, block_size, top_k)
    first = queries.start[..., None, None] + index * block_size  # [b, c, h, k']
    first = jnp.minimum(first.transpose(0, 2, 1, 3).reshape(b, h, -1), length)  # [b, h, X]
    reader = jnp.where(on_slot, queries.documents, -1)[:, None, :, None, None]
    ok = (
      valid.transpose(0, 2, 1, 3)[..., None]
      & ((first.reshape(b, h, chunk, -1)[..., None] + within) <= slots[:, None, None])
      & (per_row(key_docs, first).reshape(b, h, chunk, -1, block_size) == reader)
      & (reader >= 0)
    ).reshape(b, h, chunk, -1)
    kg, vg = (per_head(x, first).reshape(b, h, chunk, -1, x.shape[-1]) for x in (kt, vt))
    s = jnp.einsum('bchd,bhcxd->bhcx', qc, kg)
    w, _ = scaled_dot_product.masked_softmax(s, ok)
    return jnp.einsum('bhcx,bhcxd->bchd', w, vg)

  out = lax.map(one_chunk, (jnp.arange(chunks), qs))  # [chunks, b, c, h, dv]
  return out.swapaxes(0, 1).reshape(b, chunks * chunk, h, -1)[:, :n]


def tiled_moba(
  q,
  k,
  v,
  key_documents,
  *,
  block_size: int,
  top_k: int,
  scale: float,
  query_start=0,
  q_chunk: int = 64,
  k_chunk: int = 512,
):
  """MoBA as FlashAttention's tiles that skip every key tile no query of the tile reads
  (arguments as `dense_moba`).

  Queries run `q_chunk` at a time (`lax.map`, recomputed in the backward pass); each
  chunk scans the key tiles of `k_chunk` slots with an online softmax
  (`ops.online_softmax`), and a tile is computed (`lax.cond`) only when a block it holds
  is read by a query of the chunk. Time O(n (L / B) d) for the gate plus O(c_q c_k d) per
  computed tile pair: at most the causal tiles (softmax_chunked's cost), and fewer where
  the chunk's queries pick few blocks (small q_chunk, long rows, or picks that agree).
  Memory O(q_chunk (k_chunk + L / B) d) per head, never `[n, L]`.
  """
  b, n, h, d = q.shape
  length = k.shape[1]
  k, v = _repeat_heads(k, h), _repeat_heads(v, h)
  compute = jnp.promote_types(jnp.promote_types(q.dtype, k.dtype), jnp.float32)
  blocks = key_blocks(key_documents, block_size)
  means, nonempty = block_means(k, blocks)
  chunk, tile = min(q_chunk, n), min(k_chunk, length)
  chunks, tiles = -(-n // chunk), -(-length // tile)
  qs = jnp.pad(q.astype(compute) * scale, ((0, 0), (0, chunks * chunk - n), (0, 0), (0, 0)))
  qs = qs.reshape(b, chunks, chunk, h, d).swapaxes(0, 1)  # [chunks, b, c, h, d]
  extra = tiles * tile - length
  kv = tuple(
    jnp.pad(x.astype(compute), ((0, 0), (0, extra), (0, 0), (0, 0))).reshape(
      b, tiles, tile, h, x.shape[-1]
    )
    for x in (k, v)
  )
  docs = jnp.pad(blocks.documents, ((0, 0), (0, extra)), constant_values=-1)
  ids = jnp.where(docs >= 0, jnp.pad(blocks.block_id, ((0, 0), (0, extra))), -1)
  docs, ids = (x.reshape(b, tiles, tile) for x in (docs, ids))
  lowest = jnp.min(jnp.where(ids >= 0, ids, length), axis=-1)  # [b, tiles]
  highest = jnp.max(ids, axis=-1)

  @jax.checkpoint
  def one_chunk(args):
    i, qc = args
    slots = query_start + i * chunk + jnp.arange(chunk)
    on_slot = slots < query_start + n  # the padded queries of the last chunk read nothing
    queries = queries_at(blocks, jnp.minimum(slots, length - 1))
    index, valid = select_for(qc, queries, means, nonempty, block_size, top_k)
    reader = jnp.where(on_slot, queries.documents, -1)  # [b, c]
    read = jnp.where(
      valid & (reader >= 0)[..., None, None], queries.first_id[..., None, None] + index, -2
    )

    def step(state, j):
      def attend(state):
        visible = jnp.any(
          read[..., None] == ids[:, j, None, None, None, :], axis=-2
        )  # [b, c, h, t]
        visible = visible & (docs[:, j, None, None, :] == reader[..., None, None])
        visible = visible & (j * tile + jnp.arange(tile) <= slots[:, None, None])
        scores = jnp.einsum('bchd,bthd->bhct', qc, kv[0][:, j])
        return online_softmax.update(state, scores, visible.transpose(0, 2, 1, 3), kv[1][:, j])

      wanted = (read >= lowest[:, j, None, None, None]) & (read <= highest[:, j, None, None, None])
      return lax.cond(jnp.any(wanted), attend, lambda state: state, state), None

    state = online_softmax.init(b, h, chunk, v.shape[-1], compute)
    state, _ = lax.scan(step, state, jnp.arange(tiles))
    return online_softmax.finish(state).transpose(0, 2, 1, 3)

  out = lax.map(one_chunk, (jnp.arange(chunks), qs))  # [chunks, b, c, h, dv]
  return out.swapaxes(0, 1).reshape(b, chunks * chunk, h, -1)[:, :n]


def moba(
  q,
  k,
  v,
  key_documents,
  *,
  block_size: int,
  top_k: int,
  scale: float,
  form: str = 'tiles',
  query_start=0,
  q_chunk: int = 64,
  k_chunk: int = 512,
):
  """MoBA of queries at slots query_start + i over keys in slots (see the module
  docstring), by `form` (`FORMS`: 'tiles', 'gather' or 'dense'); arguments and result as
  `dense_moba`, q_chunk and k_chunk as `tiled_moba`'s (gather reads q_chunk only)."""
  common = dict(block_size=block_size, top_k=top_k, scale=scale, query_start=query_start)
  if form == 'dense':
    return dense_moba(q, k, v, key_documents, **common)
  if form == 'gather':
    return gather_moba(q, k, v, key_documents, q_chunk=q_chunk, **common)
  if form == 'tiles':
    return tiled_moba(q, k, v, key_documents, q_chunk=q_chunk, k_chunk=k_chunk, **common)
  raise ValueError(f'moba: form={form!r} is not valid; valid: {", ".join(map(repr, FORMS))}')

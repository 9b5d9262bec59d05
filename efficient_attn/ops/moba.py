"""MoBA, mixture of block attention (Lu et al. 2025): three exact forms.

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

The blocks and their selection (`select_blocks`, the rule alone, for any attention that
picks blocks per query) are in `ops.moba_blocks`.
"""

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import online_softmax
from efficient_attn.ops import scaled_dot_product
from efficient_attn.ops.moba_blocks import block_means
from efficient_attn.ops.moba_blocks import key_blocks
from efficient_attn.ops.moba_blocks import queries_at
from efficient_attn.ops.moba_blocks import repeat_heads
from efficient_attn.ops.moba_blocks import select_blocks  # noqa: F401  (re-exported)
from efficient_attn.ops.moba_blocks import select_for

FORMS = ('tiles', 'gather', 'dense')


def _blocks_and_means(q, k, v, key_documents, block_size):
  """What every form starts from: k and v repeated to q's heads, the compute dtype (float32
  or wider), the key blocks and their means with their non-empty flags."""
  h = q.shape[2]
  k, v = repeat_heads(k, h), repeat_heads(v, h)
  compute = jnp.promote_types(jnp.promote_types(q.dtype, k.dtype), jnp.float32)
  blocks = key_blocks(key_documents, block_size)
  means, nonempty = block_means(k, blocks)
  return k, v, compute, blocks, means, nonempty


def _query_chunks(q, scale, q_chunk, compute):
  """(chunk, scaled queries `[chunks, b, chunk, h, d]`, the last chunk zero-padded)."""
  b, n, h, d = q.shape
  chunk = min(q_chunk, n)
  chunks = -(-n // chunk)
  qs = jnp.pad(q.astype(compute) * scale, ((0, 0), (0, chunks * chunk - n), (0, 0), (0, 0)))
  return chunk, qs.reshape(b, chunks, chunk, h, d).swapaxes(0, 1)


def _chunk_selection(
  i, qc, chunk, n, length, query_start, blocks, means, nonempty, block_size, top_k
):
  """Chunk i's query slots `[chunk]`, which are real (`on_slot`: the padded queries of the
  last chunk read nothing), their `queries_at` and their blocks (`select_for`)."""
  slots = query_start + i * chunk + jnp.arange(chunk)
  on_slot = slots < query_start + n
  queries = queries_at(blocks, jnp.minimum(slots, length - 1))
  index, valid = select_for(qc, queries, means, nonempty, block_size, top_k)
  return slots, on_slot, queries, index, valid


def _from_chunks(out, n):
  """`[chunks, b, chunk, h, dv]` -> `[b, n, h, dv]`."""
  chunks, b, chunk, h, dv = out.shape
  return out.swapaxes(0, 1).reshape(b, chunks * chunk, h, dv)[:, :n]


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
  n = q.shape[1]
  k, v, compute, blocks, means, nonempty = _blocks_and_means(q, k, v, key_documents, block_size)
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
  b, n, h, _ = q.shape
  length = k.shape[1]
  k, v, compute, blocks, means, nonempty = _blocks_and_means(q, k, v, key_documents, block_size)
  chunk, qs = _query_chunks(q, scale, q_chunk, compute)  # [chunks, b, c, h, d]
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
    slots, on_slot, queries, index, valid = _chunk_selection(
      i, qc, chunk, n, length, query_start, blocks, means, nonempty, block_size, top_k
    )
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

  return _from_chunks(lax.map(one_chunk, (jnp.arange(qs.shape[0]), qs)), n)


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
  b, n, h, _ = q.shape
  length = k.shape[1]
  k, v, compute, blocks, means, nonempty = _blocks_and_means(q, k, v, key_documents, block_size)
  chunk, qs = _query_chunks(q, scale, q_chunk, compute)  # [chunks, b, c, h, d]
  tile = min(k_chunk, length)
  tiles = -(-length // tile)
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
    slots, on_slot, queries, index, valid = _chunk_selection(
      i, qc, chunk, n, length, query_start, blocks, means, nonempty, block_size, top_k
    )
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

  return _from_chunks(lax.map(one_chunk, (jnp.arange(qs.shape[0]), qs)), n)


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

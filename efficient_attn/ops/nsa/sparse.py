"""NSA's compressed and selected branches (Yuan et al. 2025, sections 3.3.1-3.3.2), in
blocks of queries: each query gathers only its own compressed slots and its selected
blocks, never an n x n array.

For query t (start, position p = t - start, `compress.layout`):

  * compressed: the slots e_j = start + j d + l - 1 (j = 0, 1, ...) with e_j <= t and
    `compress.slot_valid`: o_cmp = softmax_j(q . K~_j) V~_j, p_cmp that softmax;
  * selection scores: selection block i scores sum_j p_cmp[j] [compressed block j meets
    selection block i] (with l = l' = d, fla's setting, this is p_cmp[i]; the paper's
    equation 9 also sums the compressed blocks that overlap block i, for l' != l; its
    exact weights were not checked against this rule); the initial block
    (i = 0) and the two local blocks (i = p // l' and the one before) are always chosen;
    the top n blocks i <= p // l' are kept, ties to the lower i (`lax.top_k`);
  * selected: softmax attention over the real keys s <= t of the kept blocks.

`selection_heads` consecutive heads share one selection, their block scores summed (the
paper's GQA group; fla averages them, the same ranking); 1 (the default): each head
chooses its own blocks.

Cost per query: n / d slots and n_sel l' keys, so time O(n (n / d + n_sel l') dim) and memory
O(query_block (n / d + n_sel l') dim) per head at a time (`lax.map` over query blocks).
"""

from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

NUM_LOCAL = 2  # the paper's local blocks: the query's own selection block and the one before


class Blocks(NamedTuple):
  """The block sizes: l (compress_block), d (compress_stride), l' (select_block), n, and
  the heads that share one selection (consecutive heads, the paper's GQA group)."""

  compress_block: int
  compress_stride: int
  select_block: int
  num_selected: int
  selection_heads: int = 1


def overlap(num_slots: int, num_blocks: int, blocks: Blocks):
  """float `[num_slots, num_blocks]`: compressed block j meets selection block i."""
  j = jnp.arange(num_slots)[:, None] * blocks.compress_stride
  i = jnp.arange(num_blocks)[None, :] * blocks.select_block
  return ((j < i + blocks.select_block) & (j + blocks.compress_block > i)).astype(jnp.float32)


def masked_softmax(scores, valid):
  """softmax over the last axis where `valid`; 0 where a row has nothing valid (no NaN)."""
  peak = jnp.max(jnp.where(valid, scores, -jnp.inf), axis=-1, keepdims=True)
  peak = lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))
  e = jnp.exp(jnp.where(valid, scores - peak, -jnp.inf))
  total = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(total > 0, total, 1.0)


def selection_scores(p_cmp, position, blocks: Blocks, num_blocks: int):
  """Block scores `[..., heads, num_blocks]` from p_cmp `[..., heads, slots]` and the
  query positions `[...]`: forced blocks +inf, blocks after the query's -inf."""
  m = overlap(p_cmp.shape[-1], num_blocks, blocks).astype(p_cmp.dtype)
  score = jnp.einsum('...j,ji->...i', p_cmp, m, precision='highest')
  group = blocks.selection_heads
  if group > 1:  # the group's heads sum their scores and share one selection
    grouped = score.reshape(*score.shape[:-2], score.shape[-2] // group, group, num_blocks)
    score = jnp.repeat(jnp.sum(grouped, axis=-2), group, axis=-2)
  current = (position // blocks.select_block)[..., None, None]
  i = jnp.arange(num_blocks)
  forced = (i == 0) | ((i <= current) & (i >= current - (NUM_LOCAL - 1)))
  return jnp.where(forced, jnp.inf, jnp.where(i <= current, score, -jnp.inf))


def _gather_rows(x, rows):
  """x `[b, n, h, d]`, rows int `[b, q, r]` -> `[b, q, r, h, d]`."""
  b, q, r = rows.shape
  out = jnp.take_along_axis(x, rows.reshape(b, q * r)[:, :, None, None], axis=1)
  return out.reshape(b, q, r, *x.shape[2:])


def _gather_head_rows(x, rows):
  """x `[b, n, h, d]`, rows int `[b, q, h, r]` -> `[b, q, h, r, d]` (per-head rows)."""
  b, q, h, r = rows.shape
  xh = jnp.moveaxis(x, 2, 1)  # [b, h, n, d]
  idx = jnp.moveaxis(rows, 2, 1).reshape(b, h, q * r)
  out = jnp.take_along_axis(xh, idx[..., None], axis=2).reshape(b, h, q, r, x.shape[-1])
  return jnp.moveaxis(out, 1, 2)


def sparse_branches(
  q,
  k,
  v,
  ck,
  cv,
  valid_slots,
  real,
  start,
  position,
  blocks: Blocks,
  scale,
  query_block=64,
  one_document=False,
):
  """(o_cmp, o_slc), each `[batch, n, heads, dv]` float32 (float64 where inputs are).

  Args:
    q, k: `[batch, n, heads, dk]`; v: `[batch, n, heads, dv]` (compute dtype).
    ck, cv: `compress.compress` of k and v; valid_slots: `compress.slot_valid`.
    real: bool `[batch, n]`; start, position: `compress.layout`.
    blocks: the block sizes; scale: the score scale; query_block: queries per step.
    one_document: each row is one document (no segment ids; padding anywhere), so its
      queries share one start and one set of slots, gathered once per row rather than per
      query (the paper's setting: the compressed branch is then a plain matmul).
  """
  b, n, h, _ = q.shape
  l, d, sel = blocks.compress_block, blocks.compress_stride, blocks.select_block
  num_slots = max(1, (n - l) // d + 1)
  num_blocks = -(-n // sel)
  top = min(blocks.num_selected, num_blocks)
  bq = min(query_block, n)
  num_q = -(-n // bq)
  pad = num_q * bq - n
  qp = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
  startp = jnp.pad(start, ((0, 0), (0, pad)))
  positionp = jnp.pad(position, ((0, 0), (0, pad)))

  shared = None
  if one_document:  # the slots of each row, gathered once for all its queries
    row_start = jnp.min(jnp.where(real, start, n), axis=1, keepdims=True)  # first real token
    ends = row_start + (l - 1) + d * jnp.arange(num_slots)  # [b, J]
    ends_c = jnp.clip(ends, 0, n - 1)
    rows = ends_c[:, None, :]
    valid = jnp.take_along_axis(valid_slots, ends_c, axis=1) & (ends < n)
    shared = (ends, _gather_rows(ck, rows)[:, 0], _gather_rows(cv, rows)[:, 0], valid)

  def one(c):
    t = c * bq + jnp.arange(bq)  # [bq]
    qc = lax.dynamic_slice_in_dim(qp, c * bq, bq, axis=1) * scale
    st = lax.dynamic_slice_in_dim(startp, c * bq, bq, axis=1)  # [b, bq]
    pos = lax.dynamic_slice_in_dim(positionp, c * bq, bq, axis=1)
    # Compressed branch: the query's own document's slots.
    if shared is not None:  # one document per row: every query of a row has its slots
      ends, ck_rows, cv_rows, valid = shared
      ok = (ends[:, None, :] <= t[None, :, None]) & valid[:, None, :]
      scores = jnp.einsum('bqhd,bjhd->bqhj', qc, ck_rows, precision='highest')
    else:
      ends = st[..., None] + (l - 1) + d * jnp.arange(num_slots)  # [b, bq, J]
      ends_c = jnp.clip(ends, 0, n - 1)
      ok = (ends <= t[None, :, None]) & jnp.take_along_axis(
        valid_slots, ends_c.reshape(b, -1), axis=1
      ).reshape(ends.shape)
      ck_rows, cv_rows = _gather_rows(ck, ends_c), _gather_rows(cv, ends_c)
      scores = jnp.einsum('bqhd,bqjhd->bqhj', qc, ck_rows, precision='highest')
    p_cmp = masked_softmax(scores, ok[:, :, None, :])
    spec = 'bqhj,bjhd->bqhd' if shared is not None else 'bqhj,bqjhd->bqhd'
    o_cmp = jnp.einsum(spec, p_cmp, cv_rows, precision='highest')
    # Selection: the top blocks by the compressed scores, forced blocks first.
    score = selection_scores(lax.stop_gradient(p_cmp), pos, blocks, num_blocks)
    value, chosen = lax.top_k(score, top)  # [b, bq, h, top]
    rows = st[:, :, None, None, None] + chosen[..., None] * sel + jnp.arange(sel)
    rows_c = jnp.clip(rows, 0, n - 1)
    keep = (value > -jnp.inf)[..., None] & (rows <= t[None, :, None, None, None])
    keep = keep & jnp.take_along_axis(real, rows_c.reshape(b, -1), axis=1).reshape(rows.shape)
    rows_c = rows_c.reshape(b, bq, h, top * sel)
    keys = _gather_head_rows(k, rows_c)
    values = _gather_head_rows(v, rows_c)
    weights = masked_softmax(
      jnp.einsum('bqhd,bqhrd->bqhr', qc, keys, precision='highest'),
      keep.reshape(b, bq, h, top * sel),
    )
    o_slc = jnp.einsum('bqhr,bqhrd->bqhd', weights, values, precision='highest')
    return o_cmp, o_slc

  if num_q == 1:  # one block: no loop to compile
    o_cmp, o_slc = jax.tree.map(lambda o: o[None], one(0))
  else:
    o_cmp, o_slc = lax.map(one, jnp.arange(num_q))  # [num_q, b, bq, h, dv]
  merge = lambda o: jnp.moveaxis(o, 0, 1).reshape(b, num_q * bq, h, -1)[:, :n]
  return merge(o_cmp), merge(o_slc)

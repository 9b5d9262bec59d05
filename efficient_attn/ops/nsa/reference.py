"""NSA's three branches as n x n masked softmaxes: the dense reference the blocked forms
(`sparse.py`, the window via `mechanisms.local`) must equal, float64-checkable.

Each branch is one softmax over the row's n keys (or n compressed slots) under a mask
(`compress` and `sparse` say what each reads):

  * compressed: slot e is read by t iff it is valid, e <= t and e is in t's document;
  * selected: key s is read by t iff s <= t, s is real and in t's document, and the
    selection block (s - start) // l' is among t's chosen blocks (chosen by rank: the
    blocks that fewer than n blocks outscore, a tie going to the lower block);
  * window: key s is read by t iff t - w < s <= t, s is real and in t's document.

The compression phi is written here as the unfolded block `[n, l, dim]` times W_in
flattened (`compress.compress` computes it as a convolution). Memory O(n^2 + n l dim).
"""

import jax
import jax.numpy as jnp

from efficient_attn.ops.nsa import compress
from efficient_attn.ops.nsa import sparse


def compress_unfolded(x, w_in, w_out, position_embedding):
  """`compress.compress` by unfolding each row's block: `[b, n, h, dim]`."""
  l, dim, _ = w_in.shape
  n = x.shape[1]
  rows = jnp.arange(n)[:, None] - (l - 1) + jnp.arange(l)[None, :]  # [n, l]
  block = jnp.where((rows >= 0)[None, :, :, None, None], x[:, jnp.clip(rows, 0, n - 1)], 0)
  mean = jnp.mean(block, axis=2)
  flat = (block + position_embedding[None, None, :, None, :]).reshape(*block.shape[:2], l, -1, dim)
  hidden = jnp.einsum('bnlhd,ldk->bnhk', flat, w_in, precision='highest')
  return mean + jnp.einsum('bnhk,kd->bnhd', jax.nn.silu(hidden), w_out, precision='highest')


def _softmax_out(scores, valid, v):
  """masked softmax `[b, h, n, m]` times v `[b, m, h, dv]` -> `[b, n, h, dv]`."""
  weights = sparse.masked_softmax(scores, valid)
  return jnp.einsum('bhtm,bmhd->bthd', weights, v, precision='highest'), weights


def branches(q, k, v, params, real, documents, blocks: sparse.Blocks, window: int, scale):
  """(o_cmp, o_slc, o_win), each `[batch, n, heads, dv]`, in the inputs' compute dtype.

  Args:
    q, k: `[batch, n, heads, dk]`; v `[batch, n, heads, dv]`.
    params: the compression MLPs, `key_compress_in`, `key_compress_out`,
      `key_position`, and the same for `value_`.
    real: bool `[batch, n]`; documents: int `[batch, n]` document index or None.
    blocks: the block sizes; window: w; scale: the score scale.
  """
  dtype = compress.compute_dtype(q, k, v)
  q, k, v = (x.astype(dtype) for x in (q, k, v))
  n = q.shape[1]
  l, d, sel = blocks.compress_block, blocks.compress_stride, blocks.select_block
  docs = jnp.zeros(real.shape, jnp.int32) if documents is None else jnp.asarray(documents)
  start, position = compress.layout(real, documents)
  t = jnp.arange(n)
  causal = t[None, :, None] >= t[None, None, :]
  same = (docs[:, :, None] == docs[:, None, :]) & real[:, :, None]
  scores = jnp.einsum('bthd,bshd->bhts', q * scale, k, precision='highest')

  def unfold(name, x):
    p = {
      key: params[f'{name}_{key}'].astype(dtype)
      for key in ('compress_in', 'compress_out', 'position')
    }
    return compress_unfolded(x, p['compress_in'], p['compress_out'], p['position'])

  ck, cv = unfold('key', k), unfold('value', v)
  slots = compress.slot_valid(real, position, l, d)
  cmp_mask = (causal & same & slots[:, None, :])[:, None]
  cmp_scores = jnp.einsum('bthd,bshd->bhts', q * scale, ck, precision='highest')
  o_cmp, p_cmp = _softmax_out(cmp_scores, cmp_mask, cv)

  # Selection: slot e is compressed block j_e = (position_e - l + 1) // d of its document.
  num_blocks = -(-n // sel)
  num_slots = max(1, (n - l) // d + 1)
  j_e = jnp.clip((position - l + 1) // d, 0, num_slots - 1)  # [b, n]
  per_slot = jax.nn.one_hot(j_e, num_slots, dtype=dtype)  # [b, n(e), J]
  p_by_block = jnp.einsum('bhte,bej->bthj', p_cmp, per_slot, precision='highest')
  score = sparse.selection_scores(p_by_block, position, blocks, num_blocks)  # [b, t, h, i]
  # Rank: blocks i2 that beat block i (higher score, or equal and lower index).
  i = jnp.arange(num_blocks)
  a, c = score[..., :, None], score[..., None, :]
  beats = (c > a) | ((c == a) & (i[None, :] < i[:, None]))
  chosen = (jnp.sum(beats, axis=-1) < blocks.num_selected) & (score > -jnp.inf)  # [b,t,h,i]
  key_block = jnp.clip(t[None, None, :] - start[:, :, None], 0, None) // sel
  key_block = jnp.clip(key_block, 0, num_blocks - 1)  # [b, t, s]
  index = jnp.broadcast_to(key_block[:, :, None], chosen.shape[:3] + (n,))
  in_chosen = jnp.take_along_axis(chosen, index, axis=-1)  # [b, t, h, s]
  slc_mask = jnp.moveaxis(in_chosen, 2, 1) & (causal & same & real[:, None, :])[:, None]
  o_slc, _ = _softmax_out(scores, slc_mask, v)

  band = causal & (t[None, :, None] - window < t[None, None, :])
  win_mask = (band & same & real[:, None, :])[:, None]
  o_win, _ = _softmax_out(scores, win_mask, v)
  return o_cmp, o_slc, o_win

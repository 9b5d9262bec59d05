"""The decay recurrence on one device's block of a sequence split over a mesh axis
(context parallelism, `efficient_attn.layers.parallel`)."""

import jax.numpy as jnp

from efficient_attn.ops import collectives
from efficient_attn.ops.gated import documents
from efficient_attn.ops.gated.common import compute_dtype
from efficient_attn.ops.gated.common import scale_rows


def decayed_sharded(core, q, k, v, g, beta=None, *, segment_ids=None, chunk_size: int, axis: str):
  """The decay recurrence on this device's block of a sequence split over mesh axis `axis`
  (inside `jax.shard_map`): `core` (a `Cores` chunked or scan form) from the zero state
  gives the block's output and final state S; each block's (total decay A, S) is combined
  over the devices before it, (A1, S1) then (A2, S2) = (A1 A2, diag(A2) S1 + S2)
  (`collectives.exclusive_scan`), and the incoming state S_in adds
  (q_t * exp(b_t))^T S_in to each token's output (b_t: the cumulative log-decay from the
  block's start), a linear correction in place of a second pass.

  Packed rows: `segment_ids` `[b, m]` is this block of the row's ids. A block passes the
  state it receives to its end only if it holds one document, which continues the last
  real token's document on the devices before (`documents.continues`; else A = 0), and
  S_in reaches the tokens of its first document only, and only if that document continues.

  Shapes as `gated_scan` (this block's); returns out `[b, m, h, dv]` (float32; float64
  where an input is).
  """
  out, s = core(q, k, v, g, beta, segment_ids=segment_ids, chunk_size=chunk_size)
  b, m, h, _ = q.shape
  dtype = compute_dtype(q, k, v, g)
  q = q.astype(dtype)
  g = jnp.zeros((b, m, h, 1), dtype) if g is None else g.astype(dtype)
  packed = documents.packed(segment_ids, b, m, 'decayed_sharded')
  if packed is not None:
    q, g = documents.zero_padding(packed.real, q, g)
  decay = jnp.exp(jnp.sum(g, axis=1))  # [b, h, 1 or dk]
  if packed is not None:
    incoming = documents.continues(segment_ids, axis)
    decay = documents.where_rows(incoming & (packed.documents[:, -1] == 0), decay)

  def combine(earlier, later):
    (a1, s1), (a2, s2) = earlier, later
    return a1 * a2, a2[..., None] * s1 + s2

  identity = (jnp.ones_like(decay), jnp.zeros_like(s))
  _, s_in = collectives.exclusive_scan(combine, (decay, s), identity, axis)
  q_decayed = scale_rows(q, jnp.exp(jnp.cumsum(g, axis=1)))
  if packed is not None:
    s_in = documents.where_rows(incoming, s_in)
    (q_decayed,) = documents.zero_padding(packed.documents == 0, q_decayed)
  return out + jnp.einsum('bnhk,bhkv->bnhv', q_decayed, s_in)

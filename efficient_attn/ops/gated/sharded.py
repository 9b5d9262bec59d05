"""The decay recurrence on one device's block of a sequence split over a mesh axis
(context parallelism, `efficient_attn.layers.parallel`)."""

import jax.numpy as jnp

from efficient_attn.ops import collectives
from efficient_attn.ops.gated.common import F32
from efficient_attn.ops.gated.common import scale_rows


def decayed_sharded(core, q, k, v, g, beta=None, *, chunk_size: int, axis: str):
  """The decay recurrence on this device's block of a sequence split over mesh axis `axis`
  (inside `jax.shard_map`): `core` (a `Cores` chunked or scan form) from the zero state
  gives the block's output and final state S; each block's (total decay A, S) is combined
  over the devices before it, (A1, S1) then (A2, S2) = (A1 A2, diag(A2) S1 + S2)
  (`collectives.exclusive_scan`), and the incoming state S_in adds
  (q_t * exp(b_t))^T S_in to each token's output (b_t: the cumulative log-decay from the
  block's start), a linear correction in place of a second pass.

  Shapes as `gated_scan` (this block's); returns out `[b, m, h, dv]` (float32).
  """
  out, s = core(q, k, v, g, beta, chunk_size=chunk_size)
  g = g.astype(F32)
  decay = jnp.exp(jnp.sum(g, axis=1))  # [b, h, 1 or dk]

  def combine(earlier, later):
    (a1, s1), (a2, s2) = earlier, later
    return a1 * a2, a2[..., None] * s1 + s2

  identity = (jnp.ones_like(decay), jnp.zeros_like(s))
  _, s_in = collectives.exclusive_scan(combine, (decay, s), identity, axis)
  q_decayed = scale_rows(q.astype(F32), jnp.exp(jnp.cumsum(g, axis=1)))
  return out + jnp.einsum('bnhk,bhkv->bnhv', q_decayed, s_in)

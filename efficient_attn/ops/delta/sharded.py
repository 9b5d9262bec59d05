"""The (gated) delta rule on one device's block of a sequence split over a mesh axis
(context parallelism, `efficient_attn.layers.parallel`), by composed state transitions."""

import jax.numpy as jnp

from efficient_attn.ops import collectives
from efficient_attn.ops.gated import documents
from efficient_attn.ops.gated.common import compute_dtype


def transition_sharded(core, q, k, v, g, beta, *, segment_ids=None, chunk_size: int, axis: str):
  """The (gated) delta rule on this device's block of a sequence split over mesh axis
  `axis` (inside `jax.shard_map`), by composed state transitions.

  The block maps its incoming state S_in to M S_in + S, M = prod_t (I - beta_t k_t k_t^T)
  D_t `[dk, dk]` (the latest token on the left; D_t = diag(a_t), a_t one number a head
  (Gated DeltaNet) or one per key feature (KDA), or I) and S its final state from zero. Each
  column of the state follows the recurrence on its own, so one pass of `core` on values
  [0 | v] from the state [I | 0] gives both (its final state is [M | S]) and, for every
  token, r_t = M_{1..t}^T q_t beside the zero-start output o_t. The blocks' (M, S) are
  composed over the devices before this one, (M1, S1) then (M2, S2) = (M2 M1, M2 S1 + S2)
  (`collectives.exclusive_scan`), and the output is o_t + S_in^T r_t: no second pass.

  Packed rows: `segment_ids` `[b, m]` is this block of the row's ids. The pass from [I | 0]
  reaches the block's first document only (so M = 0 where another document ends the
  block), and M and S_in are 0 where the first document begins on this device
  (`documents.continues`).

  Shapes as `delta_scan` (this block's); returns out `[b, m, h, dv]` (float32; float64
  where an input is).
  """
  b, n, h, dk = k.shape
  dv = v.shape[-1]
  dtype = compute_dtype(q, k, v, g, beta)
  eye = jnp.eye(dk, dtype=dtype)
  v_aug = jnp.concatenate([jnp.zeros((b, n, h, dk), dtype), v.astype(dtype)], -1)
  s0 = jnp.broadcast_to(jnp.concatenate([eye, jnp.zeros((dk, dv), dtype)], -1), (b, h, dk, dk + dv))
  out, s = core(
    q, k, v_aug, g, beta, initial_state=s0, segment_ids=segment_ids, chunk_size=chunk_size
  )
  transition = s[..., :dk]
  incoming = None if segment_ids is None else documents.continues(segment_ids, axis)
  if incoming is not None:
    transition = documents.where_rows(incoming, transition)

  def combine(earlier, later):
    (m1, s1), (m2, s2) = earlier, later
    return (jnp.einsum('bhij,bhjk->bhik', m2, m1), jnp.einsum('bhij,bhjv->bhiv', m2, s1) + s2)

  identity = (jnp.broadcast_to(eye, (b, h, dk, dk)), jnp.zeros((b, h, dk, dv), dtype))
  _, s_in = collectives.exclusive_scan(combine, (transition, s[..., dk:]), identity, axis)
  if incoming is not None:
    s_in = documents.where_rows(incoming, s_in)
  return out[..., dk:] + jnp.einsum('bnhk,bhkv->bnhv', out[..., :dk], s_in)

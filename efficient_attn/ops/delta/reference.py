"""The (gated) delta rule token by token: the definition, and the decoding step.

    S_t = (I - beta_t k_t k_t^T) diag(a_t) S_{t-1} + beta_t k_t v_t^T,     o_t = S_t^T q_t

(a_t one number a head: Gated DeltaNet; one per key feature: KDA, fla's
`naive_recurrent_kda`; 1 without a decay: DeltaNet).
"""

import jax.numpy as jnp

from efficient_attn.ops.gated.common import compute_dtype
from efficient_attn.ops.gated.reference import scan_tokens


def delta_step(s, q_t, k_t, v_t, g_t, beta_t):
  """One token of the (gated) delta rule: (S, o_t `[b, h, dv]`), float32 (float64 where an
  input is).

  s `[b, h, dk, dv]`; q_t, k_t `[b, h, dk]`; v_t `[b, h, dv]`; g_t `[b, h, 1 or dk]` or
  None (log-decay); beta_t `[b, h]`.
  """
  dtype = compute_dtype(s, q_t, k_t, v_t, g_t, beta_t)
  s, q_t, k_t, v_t, beta_t = (x.astype(dtype) for x in (s, q_t, k_t, v_t, beta_t))
  if g_t is not None:
    s = jnp.exp(g_t.astype(dtype))[..., None] * s
  u = beta_t[..., None] * (v_t - jnp.einsum('bhkv,bhk->bhv', s, k_t))
  s = s + k_t[..., :, None] * u[..., None, :]
  return s, jnp.einsum('bhk,bhkv->bhv', q_t, s)


def delta_scan(
  q, k, v, g=None, beta=None, *, initial_state=None, segment_ids=None, chunk_size=None
):
  """The delta rule token by token (the definition); see `gated.reference.scan_tokens`.
  beta `[b, n, h]` is required."""
  del chunk_size
  return scan_tokens(
    delta_step, q, k, v, g, beta, initial_state=initial_state, segment_ids=segment_ids
  )

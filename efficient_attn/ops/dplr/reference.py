"""The diagonal-plus-low-rank (DPLR) recurrence token by token: the definition, and the
decoding step.

    S_t = (diag(exp(g_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T,      o_t = S_t^T q_t,

with the state S `[dk, dv]`, log-decays g_t `[dk]` (or one per head) and the low-rank
pair (a_t, b_t) `[dk]` each, stacked as `ab_t` `[2, dk]` (a first).
"""

import jax.numpy as jnp

from efficient_attn.ops.gated.common import compute_dtype
from efficient_attn.ops.gated.reference import scan_tokens


def dplr_step(s, q_t, k_t, v_t, g_t, ab_t):
  """One token: S = diag(exp(g_t)) S + b_t (a_t^T S) + k_t v_t^T, o_t = S^T q_t; every term
  reads the state before the token.

  s `[b, h, dk, dv]`; q_t, k_t `[b, h, dk]`; v_t `[b, h, dv]`; g_t `[b, h, 1 or dk]` (log-decay)
  or None (no decay); ab_t `[b, h, 2, dk]`: (a_t, b_t). Returns (S, o_t `[b, h, dv]`),
  float32 (float64 where an input is).
  """
  dtype = compute_dtype(s, q_t, k_t, v_t, g_t, ab_t)
  s, q_t, k_t, v_t, ab_t = (x.astype(dtype) for x in (s, q_t, k_t, v_t, ab_t))
  a_t, b_t = ab_t[..., 0, :], ab_t[..., 1, :]
  removed = jnp.einsum('bhk,bhkv->bhv', a_t, s)  # a_t^T S_{t-1}
  if g_t is not None:
    s = jnp.exp(g_t.astype(dtype))[..., None] * s
  s = s + b_t[..., :, None] * removed[..., None, :] + k_t[..., :, None] * v_t[..., None, :]
  return s, jnp.einsum('bhk,bhkv->bhv', q_t, s)


def dplr_scan(q, k, v, g=None, ab=None, *, initial_state=None, segment_ids=None, chunk_size=None):
  """The DPLR recurrence token by token (the definition); see `gated.reference.scan_tokens`
  for the shapes, packed rows and states. ab `[b, n, h, 2, dk]` (the pairs (a_t, b_t)) is
  required; a padded token (segment 0) has a = b = 0 and g = 0: its transition is I."""
  del chunk_size
  if ab is None:
    raise ValueError('dplr_scan: ab (the low-rank pairs, [b, n, h, 2, dk]) is required')
  return scan_tokens(
    dplr_step, q, k, v, g, ab, initial_state=initial_state, segment_ids=segment_ids
  )

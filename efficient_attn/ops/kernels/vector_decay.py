"""Pallas kernels of the decay recurrence with one decay per key feature (GLA), forward and
backward in one `jax.custom_vjp`.

The chunk step, the carried state and the backward are `scalar_decay`'s (see there for the
equations); what differs is the intra-chunk scores

    A_ts = sum_d q_td k_sd exp(b_td - b_sd)   (s <= t),

whose factor depends on the feature, so A is no single matrix product. Written as
(Q e^b)(K e^-b)^T it would overflow wherever the decay within a chunk is strong; here, as
fla's intra-sub-chunk kernel does, the kernel walks the keys of the chunk (`fori_loop`
over s) and forms column s of A from exp(b_t - b_s) masked to t >= s first, so every
factor is <= 1 however strong the decay. The backward walks the keys the same way:
with M_s = dA_{:, s} * exp(b - b_s) `[C, DK]`,

    dQ_A += M_s * k_s,    (dK_A)_s = sum_t M_s[t] * q_t,

and the log-decays' share is Q * dQ_A - K * dK_A (per feature), as for a per-head decay.

Cost: O(C^2 DK) elementwise work per chunk for A and its gradient, on the vector units
(fla moves the off-diagonal sub-chunks of A onto tensor cores by a split at each
sub-chunk's end; not done here). Not verified on hardware (no GPU was available).
"""

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels import scalar_decay
from efficient_attn.ops.kernels.common import F32


def _factors(b, s):
  """exp(b_t - b_s) for t >= s (else 0), `[C, DK]`: masked before exp, so every factor <= 1."""
  bs = common.row(b, s)
  after = common.iota(b.shape, 0) >= s
  return jnp.where(after, jnp.exp(jnp.where(after, b - bs, 0.0)), 0.0)


def scores(q, k, b, dtype):
  """A_ts = sum_d q_td k_sd exp(b_td - b_sd) for s <= t, else 0: `[C, C]` (float32)."""
  del dtype  # elementwise in float32
  qf, kf = q.astype(F32), k.astype(F32)
  c = q.shape[0]
  cols = common.iota((c, c), 1)

  def key(s, a):
    column = jnp.sum(qf * _factors(b, s) * common.row(kf, s), axis=1, keepdims=True)
    return a + jnp.where(cols == s, column, 0.0)

  return lax.fori_loop(0, c, key, jnp.zeros((c, c), F32))


def scores_grad(da, q, k, b, dtype):
  """(dQ, dK) of `scores` at fixed b, from dA `[C, C]` (float32)."""
  del dtype
  qf, kf = q.astype(F32), k.astype(F32)
  rows = common.iota(kf.shape, 0)

  def key(s, grads):
    dq, dk = grads
    m = common.col(da, s) * _factors(b, s)  # [C, DK]
    dks = jnp.sum(m * qf, axis=0, keepdims=True)  # [1, DK]
    return dq + m * common.row(kf, s), dk + jnp.where(rows == s, dks, 0.0)

  zeros = jnp.zeros(kf.shape, F32)
  return lax.fori_loop(0, q.shape[0], key, (zeros, zeros))


@common.per_device
def vector_decay_chunked(q, k, v, g, beta=None, state=None, chunk_size: int = 64, *, on=None):
  """The decay recurrence with one log-decay per key feature, by the Pallas kernels; equals
  `gated.gated_chunked` at the same chunk size.

  q, k `[b, n, h, dk]`, v `[b, n, h, dv]` (float32 or bfloat16), g `[b, n, h, dk]` (log-decays
  <= 0), beta ignored, state `[b, h, dk, dv]` or None (zeros); on: the platform (default:
  JAX's backend; 'cpu' interprets the kernels). Returns (out `[b, n, h, dv]`, final state
  `[b, h, dk, dv]`), float32.
  """
  del beta
  return scalar_decay.decay_kernel(
    q,
    k,
    v,
    g,
    state,
    chunk_size,
    per_feature=True,
    scores_fn=scores,
    scores_grad_fn=scores_grad,
    name='vector_decay',
    on=on,
  )

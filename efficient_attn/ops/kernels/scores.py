"""The intra-chunk score matrices of the recurrence kernels, per kind of decay, and their
gradients at fixed decays; shared by the decay kernels (`scalar_decay`, `vector_decay`)
and the delta kernels (`delta`), which also score keys against keys.

For x, y `[C, DK]`, cumulative log-decays b `[C, dg]` and a mask `[C, C]` (s <= t or s < t,
one document):

    none      A_ts = x_t . y_s
    head      A_ts = (x_t . y_s) exp(b_t - b_s)                       (b `[C, 1]`)
    feature   A_ts = sum_d x_td y_sd exp(b_td - b_sd)                 (b `[C, DK]`)

where the mask holds, else 0. A per-feature factor makes A no single matrix product, and
(X e^b)(Y e^-b)^T would overflow wherever the decay within a chunk is strong; so, as fla's
intra-sub-chunk kernel does, the kernel walks the keys of the chunk (`fori_loop` over s)
and forms column s of A from exp(b_t - b_s) masked first, so every factor is <= 1 however
strong the decay. Cost: O(C^2 DK) elementwise work per chunk on the vector units (fla
moves the off-diagonal sub-chunks onto tensor cores by a split at each sub-chunk's end;
not done here).

`scores_grad(dA, ...)` gives (dX, dY) at fixed b; the log-decays' share is then
X * dX - Y * dY per feature (summed over the features for a decay per head).
"""

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels.common import F32
from efficient_attn.ops.kernels.common import dot


def _weights(b, mask, cfg):
  """The factor matrix of a decay per head (or none): `[C, C]` float32."""
  if cfg.decay == 'head':
    return common.decay_matrix(b, mask)
  return jnp.where(mask, 1.0, 0.0).astype(F32)


def _key_factors(b, s, maskf):
  """exp(b_t - b_s) where mask[t, s] (column s of `maskf` `[C, C]`, 0 or 1), else 0:
  `[C, DK]`, masked before exp."""
  after = common.col(maskf, s) > 0.5  # [C, 1]
  return jnp.where(after, jnp.exp(jnp.where(after, b - common.row(b, s), 0.0)), 0.0)


def scores(x, y, b, mask, cfg):
  """A `[C, C]` (float32) of x, y `[C, DK]` (module docstring)."""
  if cfg.decay != 'feature':
    return dot(x, y, cfg, tb=True) * _weights(b, mask, cfg)
  xf, yf = x.astype(F32), y.astype(F32)
  c = x.shape[0]
  cols = common.iota((c, c), 1)
  maskf = jnp.where(mask, 1.0, 0.0).astype(F32)

  def key(s, a):
    column = jnp.sum(xf * _key_factors(b, s, maskf) * common.row(yf, s), axis=1, keepdims=True)
    return a + jnp.where(cols == s, column, 0.0)

  return lax.fori_loop(0, c, key, jnp.zeros((c, c), F32))


def scores_grad(da, x, y, b, mask, cfg):
  """(dX, dY) `[C, DK]` float32 of `scores` at fixed b, from dA `[C, C]` (masked here)."""
  if cfg.decay != 'feature':
    m = da * _weights(b, mask, cfg)
    return dot(m, y, cfg), dot(m, x, cfg, ta=True)
  xf, yf = x.astype(F32), y.astype(F32)
  maskf = jnp.where(mask, 1.0, 0.0).astype(F32)
  rows = common.iota(yf.shape, 0)

  def key(s, grads):
    dx, dy = grads
    m = common.col(da, s) * _key_factors(b, s, maskf)  # [C, DK]
    dys = jnp.sum(m * xf, axis=0, keepdims=True)  # [1, DK]
    return dx + m * common.row(yf, s), dy + jnp.where(rows == s, dys, 0.0)

  zeros = jnp.zeros(yf.shape, F32)
  return lax.fori_loop(0, x.shape[0], key, (zeros, zeros))

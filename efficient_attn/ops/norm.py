"""The gated recurrences' norms over features: RMSNorm (their output norm) and the L2
normalisation of the delta rule's queries and keys. Float32."""

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.gated.common import F32
from efficient_attn.ops.gated.common import scale_rows

NORM_EPS = 1e-5  # the output RMSNorm's epsilon (fla's and Mamba-2's default)


def rms_norm(x, scale=None, axes=(-1,), eps: float = NORM_EPS):
  """x / sqrt(mean(x^2 over axes) + eps) (* scale): the output norm (float32)."""
  x = x.astype(F32)
  inv = lax.rsqrt(jnp.mean(jnp.square(x), axis=axes, keepdims=True) + eps)
  if axes in ((-1,), -1):
    x = scale_rows(x, inv)
  else:
    x = x * inv
  return x if scale is None else x * scale.astype(F32)


def l2_normalize(x, eps: float = 1e-6):
  """x / sqrt(||x||^2 + eps) over the last axis (float32), as fla's l2norm."""
  x = x.astype(F32)
  return scale_rows(x, lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps))

"""The gated recurrences' norms over features: RMSNorm (their output norm) and the L2
normalisation of the delta rule's queries and keys. Float32 (float64 where the input is)."""

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.gated.common import compute_dtype
from efficient_attn.ops.gated.common import scale_rows

NORM_EPS = 1e-5  # the output RMSNorm's epsilon (fla's and Mamba-2's default)


def rms_norm(x, scale=None, axes=(-1,), eps: float = NORM_EPS):
  """x / sqrt(mean(x^2 over axes) + eps) (* scale): the output norm (float32, or float64)."""
  x = x.astype(compute_dtype(x))
  inv = lax.rsqrt(jnp.mean(jnp.square(x), axis=axes, keepdims=True) + eps)
  if axes in ((-1,), -1):
    x = scale_rows(x, inv)
  else:
    x = x * inv
  return x if scale is None else x * scale.astype(compute_dtype(x, scale))


def l2_normalize(x, eps: float = 1e-6):
  """x / sqrt(||x||^2 + eps) over the last axis (float32, or float64), as fla's l2norm."""
  x = x.astype(compute_dtype(x))
  return scale_rows(x, lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps))

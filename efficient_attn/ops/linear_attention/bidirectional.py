"""The bidirectional (non-causal) form of kernel attention: every query sees every key.

    out_i = num_q_i^T S / safe(phi_q_i . Z),   S = sum_j num_k_j v_j^T,  Z = sum_j phi_k_j

S and Z are summed over all keys once, right to left: time O(n f dv), memory
O(n (f + dv) + f dv) per head instead of softmax's O(n^2).
"""

from typing import Optional

import jax.numpy as jnp

from efficient_attn.ops.linear_attention import common
from efficient_attn.ops.linear_attention.common import KernelFeatures
from efficient_attn.ops.linear_attention.recurrent import state_of_sums


def key_value_sums(features: KernelFeatures, v: jnp.ndarray):
  """(S `[batch, heads, f, dv]`, Z `[batch, heads, f]`) of all keys: sum_j num_k_j v_j^T and
  sum_j phi_k_j."""
  _, num_k = features.numerator()
  return jnp.einsum('bkhf,bkhd->bhfd', num_k, v), jnp.sum(features.phi_k, axis=1)


def read_sums(features: KernelFeatures, s, z, *, eps: float, normalize: bool) -> jnp.ndarray:
  """`[batch, q_length, heads, dv]`: num_q^T S / safe(phi_q . Z) (without normalize: num_q^T
  S) for each query."""
  num_q, _ = features.numerator()
  out = jnp.einsum('bqhf,bhfd->bqhd', num_q, s)
  if normalize:
    out = common.normalize_by(out, jnp.einsum('bqhf,bhf->bqh', features.phi_q, z), eps)
  return out


def bidirectional_kernel_attention(
  features: KernelFeatures,
  v: jnp.ndarray,
  key_padding: Optional[jnp.ndarray] = None,
  *,
  eps: float = 1e-6,
  normalize: bool = True,
):
  """Non-causal kernel attention over the unpadded keys.

  Args:
    features: `KernelFeatures`: phi_q `[batch, q_length, heads, f]`, phi_k `[batch,
      kv_length, heads, f]` (and optional numerator features shaped like them).
    v: `[batch, kv_length, heads, dv]`.
    key_padding: optional bool `[batch, kv_length]`, True = real key.
    eps: denominator clamp, see `safe_denominator`.
    normalize: divide by phi_q . Z (False: plain num_q^T S, no denominator).

  Returns:
    (`[batch, q_length, heads, dv]` in v's dtype, the `KernelState` of all keys in float32
    or wider).
  """
  features, values, _ = common.prepare(features, v, key_padding)
  s, z = key_value_sums(features, values)
  out = read_sums(features, s, z, eps=eps, normalize=normalize)
  return out.astype(v.dtype), state_of_sums(s, z)

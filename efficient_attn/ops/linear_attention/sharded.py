"""Kernel attention on one device's block of a sequence split over a mesh axis.

Inside `jax.shard_map` (context parallelism, `efficient_attn.layers.parallel`), each device
holds a contiguous block of the sequence. Non-causal, the key sums S and Z are summed over
the devices (`lax.psum`). Causal (the prefix-state form), each device's block summary (S,
Z, and a gate's total decay) is combined over the devices before it
(`collectives.exclusive_scan`) and starts the block's chunked scan. Self-attention only.
"""

from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import collectives
from efficient_attn.ops.linear_attention import common
from efficient_attn.ops.linear_attention.bidirectional import key_value_sums
from efficient_attn.ops.linear_attention.bidirectional import read_sums
from efficient_attn.ops.linear_attention.chunk import check_lengths
from efficient_attn.ops.linear_attention.chunk import chunked_scan
from efficient_attn.ops.linear_attention.common import KernelFeatures
from efficient_attn.ops.linear_attention.recurrent import state_of_sums


def prefix_state(features: KernelFeatures, v, log_g, axis: str):
  """The causal state (S, Z) `[b, h, f, dv]`, `[b, h, f]` of the keys on the devices before
  this one on `axis`: each block's summary (its keys' S and Z, decayed to the block's end
  by a gate, and the gate's total decay), combined by `collectives.exclusive_scan`.

  The inputs are prepared (`common.prepare`); `log_g` is the gate's log decay or None.
  """
  _, num_k = features.numerator()
  if log_g is None:
    decay, weights = None, None
  else:
    cum = jnp.cumsum(log_g, axis=1)  # [b, n, h]
    decay = jnp.exp(cum[:, -1])  # [b, h]: the block's total decay
    weights = jnp.exp(cum[:, -1:] - cum)[..., None]  # each key decayed to the block's end
  scaled = lambda x: x if weights is None else x * weights
  summary = (
    decay,
    jnp.einsum('bkhf,bkhd->bhfd', scaled(num_k), v),
    jnp.sum(scaled(features.phi_k), axis=1),
  )

  def combine(earlier, later):
    a1, s1, z1 = earlier
    a2, s2, z2 = later
    if a2 is None:
      return None, s1 + s2, z1 + z2
    return a1 * a2, a2[..., None, None] * s1 + s2, a2[..., None] * z1 + z2

  identity = jax.tree.map(lambda x: jnp.ones_like(x) if x.ndim == 2 else jnp.zeros_like(x), summary)
  _, s, z = collectives.exclusive_scan(combine, summary, identity, axis)
  return s, z


def bidirectional_sharded(
  features: KernelFeatures,
  v: jnp.ndarray,
  axis: str,
  key_padding: Optional[jnp.ndarray] = None,
  *,
  eps: float = 1e-6,
  normalize: bool = True,
):
  """`bidirectional_kernel_attention` of this device's queries over the keys of every device
  on mesh axis `axis`. Arguments and shapes as there (lengths: this block's).

  Returns:
    (`[batch, q_length, heads, dv]` in v's dtype, the `KernelState` of all devices' keys).
  """
  features, values, _ = common.prepare(features, v, key_padding)
  s, z = lax.psum(key_value_sums(features, values), axis)
  out = read_sums(features, s, z, eps=eps, normalize=normalize)
  return out.astype(v.dtype), state_of_sums(s, z)


def causal_sharded(
  features: KernelFeatures,
  v: jnp.ndarray,
  axis: str,
  key_padding: Optional[jnp.ndarray] = None,
  gate: Optional[jnp.ndarray] = None,
  *,
  eps: float = 1e-6,
  normalize: bool = True,
  chunk_size: Optional[int] = None,
):
  """`causal_kernel_attention` of this device's block, continuing the state of the blocks
  before it on mesh axis `axis` (`prefix_state`). Arguments and shapes as there (lengths:
  this block's).

  Returns:
    (`[batch, length, heads, dv]` in v's dtype, the `KernelState` of the whole prefix up to
    this block's last key).
  """
  features, values, log_g = common.prepare(features, v, key_padding, gate)
  check_lengths(features)
  out, (s, z) = chunked_scan(
    features,
    values,
    log_g,
    eps=eps,
    normalize=normalize,
    chunk_size=chunk_size,
    initial=prefix_state(features, values, log_g, axis),
  )
  return out.astype(v.dtype), state_of_sums(s, z)

"""Kernel (linear) attention: the core shared by linear attention, RFA and Performer.

With query and key features phi_q, phi_k (any feature map),

  out_i = phi_q_i^T S / (phi_q_i . Z),   S = sum_j phi_k_j v_j^T,  Z = sum_j phi_k_j

computed right-to-left in O(n f dv) instead of O(n^2) (Katharopoulos et al. 2020,
"Transformers are RNNs"). One file per form, each a pure function returning the output
and the final `KernelState`:

  bidirectional       `bidirectional_kernel_attention`: non-causal, S and Z summed once;
  chunk               `causal_kernel_attention`: the prefix sums S_i, Z_i (j <= i) by a
                      chunked scan, optionally with RFA's recency gate;
  recurrent           `kernel_attention_step`: the causal form's RNN, one decoding step
                      in O(f dv) whatever the position (`KernelState`, `init_kernel_state`);
  sharded             `bidirectional_sharded`, `causal_sharded`: one device's block of a
                      sequence split over a mesh axis (the key sums psummed, or the state
                      of the blocks before it: the prefix-state form);
  common              `KernelFeatures` (`rotary_features`), the inputs' preparation,
                      `safe_denominator`;
  head_rows           `heads_as_batch`: a mechanism run with heads folded into the batch.

`kernel_attention` picks the form from `causal` and `sequence_axis`.

Shapes: phi_q `[batch, q_length, heads, f]`, phi_k `[batch, kv_length, heads, f]`,
v `[batch, kv_length, heads, dv]` -> `[batch, q_length, heads, dv]`.
"""

from typing import Optional

import jax.numpy as jnp

from efficient_attn.ops.linear_attention.bidirectional import bidirectional_kernel_attention
from efficient_attn.ops.linear_attention.chunk import CAUSAL_CHUNK
from efficient_attn.ops.linear_attention.chunk import causal_chunk_size
from efficient_attn.ops.linear_attention.chunk import causal_kernel_attention
from efficient_attn.ops.linear_attention.common import KernelFeatures
from efficient_attn.ops.linear_attention.common import normalize_by
from efficient_attn.ops.linear_attention.common import rotary_features
from efficient_attn.ops.linear_attention.common import safe_denominator
from efficient_attn.ops.linear_attention.head_rows import LOOP_ROWS
from efficient_attn.ops.linear_attention.head_rows import heads_as_batch
from efficient_attn.ops.linear_attention.head_rows import platform_loops_rows
from efficient_attn.ops.linear_attention.recurrent import KernelState
from efficient_attn.ops.linear_attention.recurrent import init_kernel_state
from efficient_attn.ops.linear_attention.recurrent import kernel_attention_step
from efficient_attn.ops.linear_attention.sharded import bidirectional_sharded
from efficient_attn.ops.linear_attention.sharded import causal_sharded


def kernel_attention(
  features: KernelFeatures,
  v: jnp.ndarray,
  *,
  key_padding: Optional[jnp.ndarray] = None,
  causal: bool = False,
  gate: Optional[jnp.ndarray] = None,
  eps: float = 1e-6,
  normalize: bool = True,
  chunk_size: Optional[int] = None,
  sequence_axis: Optional[str] = None,
):
  """out_i = num_q_i^T S / safe(phi_q_i . Z) over the visible keys, in the form asked for.

  Args:
    features: `KernelFeatures`: phi_q `[batch, q_length, heads, f]`, phi_k `[batch,
      kv_length, heads, f]`, optional numerator features shaped like them.
    v: `[batch, kv_length, heads, dv]`.
    key_padding: optional bool `[batch, kv_length]`, True = real key.
    causal: prefix (autoregressive) attention, `causal_kernel_attention` (needs q_length
      == kv_length); else `bidirectional_kernel_attention`.
    gate: optional `[batch, kv_length, heads]` recency gate in (0, 1); causal only.
    eps: denominator clamp, see `safe_denominator`.
    normalize: divide by phi_q . Z (False: plain num_q^T S, no denominator).
    chunk_size: causal chunk length (None: `causal_chunk_size()`, per platform).
    sequence_axis: the inputs are this device's block of a sequence split over the mesh
      axis of that name, inside `jax.shard_map`: `causal_sharded` or
      `bidirectional_sharded`.

  Returns:
    (`[batch, q_length, heads, dv]` in v's dtype, the final `KernelState` in float32 or
    wider: the prefill for recurrent decoding, its log_scale left at "empty").
  """
  if gate is not None and not causal:
    raise ValueError('a recency gate needs causal=True')
  if causal and sequence_axis is not None:
    return causal_sharded(
      features,
      v,
      sequence_axis,
      key_padding,
      gate,
      eps=eps,
      normalize=normalize,
      chunk_size=chunk_size,
    )
  if causal:
    return causal_kernel_attention(
      features, v, key_padding, gate, eps=eps, normalize=normalize, chunk_size=chunk_size
    )
  if sequence_axis is not None:
    return bidirectional_sharded(
      features, v, sequence_axis, key_padding, eps=eps, normalize=normalize
    )
  return bidirectional_kernel_attention(features, v, key_padding, eps=eps, normalize=normalize)


__all__ = [
  'CAUSAL_CHUNK',
  'KernelFeatures',
  'KernelState',
  'LOOP_ROWS',
  'bidirectional_kernel_attention',
  'bidirectional_sharded',
  'causal_chunk_size',
  'causal_kernel_attention',
  'causal_sharded',
  'heads_as_batch',
  'init_kernel_state',
  'kernel_attention',
  'kernel_attention_step',
  'normalize_by',
  'platform_loops_rows',
  'rotary_features',
  'safe_denominator',
]

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
  documents           `causal_packed`, `bidirectional_packed`: packed rows (`segment_ids`),
                      the sums restarting at each document;
  common              `KernelFeatures` (`rotary_features`), the inputs' preparation,
                      `safe_denominator`;
  head_rows           `heads_as_batch`: a mechanism run with heads folded into the batch.

`kernel_attention` picks the form from `causal` and `sequence_axis`.

Shapes: phi_q `[batch, q_length, heads, f]`, phi_k `[batch, kv_length, heads, f]`,
v `[batch, kv_length, heads, dv]` -> `[batch, q_length, heads, dv]`.
"""

from typing import Optional

import jax.numpy as jnp

from efficient_attn.ops import segments
from efficient_attn.ops.linear_attention import common
from efficient_attn.ops.linear_attention.bidirectional import bidirectional_kernel_attention
from efficient_attn.ops.linear_attention.chunk import CAUSAL_CHUNK
from efficient_attn.ops.linear_attention.chunk import causal_chunk_size
from efficient_attn.ops.linear_attention.chunk import causal_kernel_attention
from efficient_attn.ops.linear_attention.common import KernelFeatures
from efficient_attn.ops.linear_attention.common import normalize_by
from efficient_attn.ops.linear_attention.common import rotary_features
from efficient_attn.ops.linear_attention.common import safe_denominator
from efficient_attn.ops.linear_attention.documents import bidirectional_packed
from efficient_attn.ops.linear_attention.documents import causal_packed
from efficient_attn.ops.linear_attention.documents import zero_padding
from efficient_attn.ops.linear_attention.head_rows import LOOP_ROWS
from efficient_attn.ops.linear_attention.head_rows import heads_as_batch
from efficient_attn.ops.linear_attention.head_rows import platform_loops_rows
from efficient_attn.ops.linear_attention.recurrent import KernelState
from efficient_attn.ops.linear_attention.recurrent import init_kernel_state
from efficient_attn.ops.linear_attention.recurrent import kernel_attention_step
from efficient_attn.ops.linear_attention.recurrent import state_of_sums
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
  segment_ids: Optional[jnp.ndarray] = None,
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
    segment_ids: optional int `[batch, length]`, a packed row (0: padding; docs/design.md,
      "Documents"): each query sees only keys of its document (`causal_packed`,
      `bidirectional_packed`). Self-attention only; with `sequence_axis`, causal only,
      and the returned state is None.

  Returns:
    (`[batch, q_length, heads, dv]` in v's dtype, the final `KernelState` in float32 or
    wider: the prefill for recurrent decoding, its log_scale left at "empty").
  """
  if gate is not None and not causal:
    raise ValueError('a recency gate needs causal=True')
  if segment_ids is not None:
    return _packed(
      features, v, segment_ids, key_padding, causal, gate, eps, normalize, chunk_size, sequence_axis
    )
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


def _packed(features, v, segment_ids, key_padding, causal, gate, eps, normalize, chunk_size, axis):
  """`kernel_attention` on packed rows: `causal_packed` or `bidirectional_packed`."""
  if axis is not None and not causal:
    raise ValueError(
      f'bidirectional kernel attention takes segment_ids on one device only, not split '
      f'over sequence_axis={axis!r}; valid: causal=True, segment_ids=None, or '
      f'sequence_axis=None'
    )
  b, n = v.shape[:2]
  if features.phi_q.shape[1] != n:
    raise ValueError(
      f'kernel attention with segment_ids is self-attention: q_length '
      f'{features.phi_q.shape[1]} != kv_length {n}'
    )
  ids = segments.check(segment_ids, b, n, 'kernel attention')
  if key_padding is not None:
    ids = jnp.where(jnp.asarray(key_padding, bool), ids, 0)
  # Every input zeroed at the padding first (by `where`): whatever it held (NaN) reaches no
  # sum and no gradient, its own included.
  *features, v, gate = zero_padding(ids, *features, v, gate)
  features, values, log_g = common.prepare(KernelFeatures(*features), v, ids != 0, gate)
  if causal:
    out, (s, z) = causal_packed(
      features,
      values,
      log_g,
      ids,
      eps=eps,
      normalize=normalize,
      chunk_size=causal_chunk_size(chunk_size),
      axis=axis,
    )
    if axis is not None:
      return out.astype(v.dtype), None  # a split row's block: no state
  else:
    out, (s, z) = bidirectional_packed(
      features, values, ids, eps=eps, normalize=normalize, chunk_size=causal_chunk_size(chunk_size)
    )
  return out.astype(v.dtype), state_of_sums(s, z)


__all__ = [
  'CAUSAL_CHUNK',
  'KernelFeatures',
  'KernelState',
  'LOOP_ROWS',
  'bidirectional_kernel_attention',
  'bidirectional_packed',
  'bidirectional_sharded',
  'causal_chunk_size',
  'causal_kernel_attention',
  'causal_packed',
  'causal_sharded',
  'heads_as_batch',
  'init_kernel_state',
  'kernel_attention',
  'kernel_attention_step',
  'normalize_by',
  'platform_loops_rows',
  'rotary_features',
  'safe_denominator',
  'zero_padding',
]

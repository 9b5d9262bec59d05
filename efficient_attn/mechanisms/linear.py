"""Kernelised linear attention with deterministic feature maps (Katharopoulos et al. 2020).

With a feature map phi, attention weights sim(q_i, k_j) = phi(q_i) . phi(k_j)
give out_i = phi(q_i)^T S / (phi(q_i) . Z) with S = sum_j phi(k_j) v_j^T and
Z = sum_j phi(k_j), computed right-to-left by the shared core
`efficient_attn.ops.linear_attention` in O(n d dv) instead of O(n^2). The causal
form's prefix sums are the hidden state of an RNN: decoding costs O(d dv) per
token whatever the position.

Shapes: q `[batch, q_length, heads, d]`, k `[batch, kv_length, heads, d]`,
v `[batch, kv_length, heads, dv]` -> `[batch, q_length, heads, dv]`. Only the
key-padding part of a mask can be honoured (no q x k matrix is formed);
causality is requested with `causal=True`.

Based's linear attention (Arora et al. 2024) is `feature_map='taylor'` with
`qk_dim=16`: queries and keys projected to 16 features per head, widened to the
1 + 16 + 256 = 273 Taylor features (the state: 273 x dv per head). Its other
half, sliding-window attention in other layers, is the `local` mechanism; a stack
mixing the two is not buildable here (one mechanism per model).
"""

from typing import Callable, Optional, Union

import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.kernel_family import CHUNK_SIZE
from efficient_attn.mechanisms.kernel_family import KernelMechanism
from efficient_attn.mechanisms.kernel_family import segment_ids_of
from efficient_attn.ops import feature_maps
from efficient_attn.ops import masking
from efficient_attn.ops import rotary
from efficient_attn.ops.linear_attention import KernelState
from efficient_attn.ops.linear_attention import heads_as_batch
from efficient_attn.ops.linear_attention import init_kernel_state  # noqa: F401  (re-exported)
from efficient_attn.ops.linear_attention import kernel_attention
from efficient_attn.ops.linear_attention import kernel_attention_step
from efficient_attn.ops.linear_attention import rotary_features
from efficient_attn.ops.linear_attention import zero_padding

FeatureMapArg = Union[str, Callable[[jnp.ndarray], jnp.ndarray]]


def linear_features(q: jnp.ndarray, k: jnp.ndarray, feature_map: FeatureMapArg = 'elu'):
  """(phi_q, phi_k, normalize) for linear attention.

  'elu' (elu + 1), 'relu' and 'taylor' (1 + s + s^2 / 2 for s = q . k / sqrt(d),
  with 1 + d + d^2 features) are normalised kernels. 'identity' is the
  softmax-free linear attention (Q / sqrt(d_k)) (K^T / sqrt(d_k) V) =
  (1/d_k) Q (K^T V): phi_q = q / d_k, phi_k = k and no denominator. A callable
  is used as phi for both q and k with normalisation.
  """
  if callable(feature_map):
    return feature_map(q), feature_map(k), True
  fm = feature_maps.get_feature_map(feature_map)
  phi_q, phi_k = fm(q), fm(k)
  if feature_map == 'identity':
    return phi_q / q.shape[-1], phi_k, False
  return phi_q, phi_k, True


def _check_rotary(feature_map: FeatureMapArg, positions) -> None:
  """Rotary positions rotate pairs of features; the Taylor map's 1 + d + d^2 are odd."""
  if positions is not None and feature_map == 'taylor':
    even = [name for name in feature_maps.FEATURE_MAPS if name != 'taylor']
    raise ValueError(
      "rotary positions cannot rotate the 'taylor' feature map's 1 + d + d^2 "
      'features (an odd count); valid: rotary=False, or feature_map '
      f'{", ".join(even)}'
    )


def linear_attention(
  q: jnp.ndarray,
  k: jnp.ndarray,
  v: jnp.ndarray,
  mask=None,
  causal: bool = False,
  feature_map: FeatureMapArg = 'elu',
  eps: float = 1e-6,
  chunk_size: Optional[int] = None,
  return_state: bool = False,
  positions=None,
  sequence_axis: Optional[str] = None,
  segment_ids=None,
):
  """Linear attention phi(q) (phi(k)^T v) / (phi(q) . sum_j phi(k_j)).

  feature_map:
    * 'elu': phi = elu + 1 (Katharopoulos et al.), normalised;
    * 'relu': phi = relu, normalised (an all-zero row gives output 0);
    * 'taylor': phi(q) . phi(k) = 1 + s + s^2 / 2, s = q . k / sqrt(d), normalised
      (Based's map; 1 + d + d^2 features, so the state is (1 + d + d^2) x dv per head:
      4,161 x dv at d = 64; Based projects queries and keys to d = 16, `qk_dim`);
    * 'identity': softmax-free (1/d_k) Q (K^T V), without a denominator
      (normalize=False);
    * a callable phi, normalised.

  Time O(n d dv), memory O(n d + d dv) per head (causal: see `causal_kernel_attention`).

  Args:
    q: `[batch, q_length, heads, d]`; k: `[batch, kv_length, heads, d]`;
    v: `[batch, kv_length, heads, dv]`.
    mask: any `efficient_attn.ops.masking` form; reduced to key padding with
      `masking.key_padding_from_mask` (padded keys get zero weight).
    causal: query i sees keys j <= i (needs q_length == kv_length).
    eps: denominator clamp (see `efficient_attn.ops.linear_attention.safe_denominator`).
    chunk_size: causal chunk length (None: 64 on CPU, 256 on GPU and TPU).
    return_state: also return the final `KernelState` (prefill for decoding).
    positions: optional (query positions `[q_length]`, key positions
      `[kv_length]`): rotary positions in RoFormer's linear form (Su et al.
      2021; `efficient_attn.ops.rotary.numerator`).
    sequence_axis: the inputs are one device's block of a sequence split over this
      mesh axis (inside `jax.shard_map`; see `ops.linear_attention.sharded`);
      positions are then the block's.
    segment_ids: optional int `[batch, length]`, packed rows (0: padding): each query
      sees only the keys of its document (`ops.linear_attention.documents`).

  Returns:
    `[batch, q_length, heads, dv]` in v's dtype (and the state if requested).
  """
  _check_rotary(feature_map, positions)
  k, v, kp = masking.checked_keys_values(q, k, v, mask, name='linear attention', causal=causal)
  q, k, v = zero_padding(segment_ids, q, k, v)  # packed rows: 0 at the padding
  if q.shape[2] > 1 and sequence_axis is None:
    return heads_as_batch(
      linear_attention,
      q,
      k,
      v,
      kp,
      return_state,
      causal=causal,
      feature_map=feature_map,
      eps=eps,
      chunk_size=chunk_size,
      positions=positions,
      segment_ids=segment_ids,
    )
  phi_q, phi_k, normalize = linear_features(q, k, feature_map)
  out, state = kernel_attention(
    rotary_features(phi_q, phi_k, positions),
    v,
    key_padding=kp,
    causal=causal,
    eps=eps,
    normalize=normalize,
    chunk_size=chunk_size,
    sequence_axis=sequence_axis,
    segment_ids=segment_ids,
  )
  return (out, state) if return_state else out


def linear_attention_step(
  state: KernelState,
  q_t: jnp.ndarray,
  k_t: jnp.ndarray,
  v_t: jnp.ndarray,
  feature_map: FeatureMapArg = 'elu',
  eps: float = 1e-6,
  key_valid: Optional[jnp.ndarray] = None,
  position=None,
):
  """One decoding step of causal `linear_attention`.

  Tokens are `[batch, heads, d]` (or `[batch, 1, heads, d]`); the state comes from
  `init_kernel_state(batch, heads, f, dv)` with f = `feature_maps.feature_dim(feature_map,
  d)` (d, or 1 + d + d^2 for 'taylor'). Returns (new_state, out_t), see
  `kernel_attention_step`. O(f dv) per (batch, head) and token. `position`: the
  token's rotary position (with `positions` in the parallel form).
  """
  _check_rotary(feature_map, rotary.at(position))
  phi_q, phi_k, normalize = linear_features(q_t, k_t, feature_map)
  return kernel_attention_step(
    state,
    rotary_features(phi_q, phi_k, rotary.at(position)),
    v_t,
    eps=eps,
    normalize=normalize,
    key_valid=key_valid,
  )


@registry.register
class Linear(KernelMechanism):
  name = 'linear'
  description = 'kernelised linear attention (elu+1 / relu / identity / Taylor)'
  citation = 'Katharopoulos et al. 2020'
  options = (
    registry.Option(
      'feature_map',
      'elu',
      str,
      'phi: elu (+1), relu, identity or taylor (second-order Taylor of exp, 1 + d + d^2 features)',
      choices=tuple(feature_maps.FEATURE_MAPS),
    ),
    registry.Option('eps', 1e-6, float, 'denominator clamp', above=0.0),
    CHUNK_SIZE,
    registry.Option(
      'qk_dim',
      None,
      int,
      'width of queries and keys per head (None: '
      'head_dim; Based: 16 with feature_map=taylor, 273 features)',
      minimum=1,
      allow_none=True,
    ),
  )
  complexity = ('O(n d^2)', 'O(n d + d^2)')
  knob = ('feature_map', ('elu', 'relu', 'identity'))

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return linear_attention(
      q,
      k,
      v,
      mask=mask,
      causal=causal,
      feature_map=options.feature_map,
      eps=options.eps,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
      segment_ids=segment_ids_of(ctx),
    )

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    return linear_attention(
      q,
      k,
      v,
      mask=mask,
      causal=causal,
      feature_map=options.feature_map,
      eps=options.eps,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
      sequence_axis=axis,
      segment_ids=segment_ids_of(ctx),
    )

  def head_shapes(self, options, *, heads, head_dim):
    return heads, options.qk_dim or head_dim, head_dim

  def feature_dim(self, options, head_dim):
    return feature_maps.feature_dim(options.feature_map, head_dim)

  def grouped_state(self, options):
    return True

  def token_step(self, options, params, state, q_t, k_t, v_t, *, ctx, key_valid):
    return linear_attention_step(
      state,
      q_t,
      k_t,
      v_t,
      feature_map=options.feature_map,
      eps=options.eps,
      key_valid=key_valid,
      position=ctx.position,
    )

"""Nystromformer attention (Xiong et al., 2021): landmarks and a pseudo-inverse.

With m landmark queries Q~ and keys K~ (segment means of Q and K), the softmax
matrix is approximated by the Nystrom form

  softmax(Q K^T) ~= F A^+ B,   F = softmax(Q K~^T)   [n x m],
                               A = softmax(Q~ K~^T)  [m x m],
                               B = softmax(Q~ K^T)   [m x n],

(all scores scaled by `scale`) and the output is F (A^+ (B V)), never forming an
n x n matrix: time O(n m d + m^3) and memory O(n m) per head. A^+ is the
iterative Moore-Penrose pseudo-inverse of the paper. With as many landmarks as
tokens, Q~ = Q, K~ = K and F A^+ B = A A^+ A = A: exact softmax attention.

Not causal: landmarks average over all positions, future ones included.
Shapes follow `efficient_attn.registry.Mechanism.attend`.
"""

from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import masking
from efficient_attn.ops.scaled_dot_product import softmax_weights


def iterative_pinv(a, iterations: int = 6):
  """Moore-Penrose pseudo-inverse of square matrices by the paper's iteration.

  Z_0 = A^T / (||A||_1 ||A||_inf),
  Z_{j+1} = 1/4 Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))),

  which converges to A^+ (Razavi et al., 2014). The norms are taken per matrix
  (the official code uses one maximum over the whole batch, which makes a
  sample's result depend on the other samples). Zero rows/columns of A stay
  zero in Z, so a landmark excluded by masking drops out exactly.

  Args:
    a: `[..., m, m]`; computed in float32 (or wider) whatever its dtype.
    iterations: number of iterations (6 in the paper); the error contracts
      quickly once ||I - A Z|| < 1 but more are needed for ill-conditioned A.

  Returns:
    `[..., m, m]` float32 (or wider).
  """
  a = a.astype(jnp.promote_types(a.dtype, jnp.float32))
  m = a.shape[-1]
  eye = jnp.eye(m, dtype=a.dtype)
  abs_a = jnp.abs(a)
  norm_1 = jnp.max(jnp.sum(abs_a, axis=-2), axis=-1)  # max column sum
  norm_inf = jnp.max(jnp.sum(abs_a, axis=-1), axis=-1)  # max row sum
  denom = norm_1 * norm_inf
  denom = jnp.where(denom > 0, denom, 1.0)
  z = jnp.swapaxes(a, -1, -2) / denom[..., None, None]

  def step(_, z):
    az = a @ z
    return 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))

  return lax.fori_loop(0, iterations, step, z)


def _segment_means(x, weights, num_segments: int):
  """Means of `x` `[b, n, h, d]` over m contiguous segments, weighted by `weights` `[b, n]`.

  Token i goes to segment floor(i m / n): m segments of n // m or n // m + 1
  tokens, none empty when m <= n (for n divisible by m, the usual equal
  segments). Only tokens with weight 1 (real, unmasked) are averaged.

  Returns:
    means `[b, m, h, d]` (0 for a segment with no real token) and a bool
    `[b, m]` telling which segments hold at least one real token.
  """
  n = x.shape[1]
  seg = (jnp.arange(n) * num_segments) // n
  # where, not a product: a masked token holding NaN or Inf stays out (0 x NaN is NaN).
  xw = jnp.where(weights[:, :, None, None] > 0, x * weights[:, :, None, None].astype(x.dtype), 0)
  sums = jax.ops.segment_sum(
    jnp.moveaxis(xw, 1, 0), seg, num_segments, indices_are_sorted=True
  )  # [m, b, h, d]
  counts = jax.ops.segment_sum(
    jnp.moveaxis(weights, 1, 0), seg, num_segments, indices_are_sorted=True
  )  # [m, b]
  means = sums / jnp.maximum(counts, 1)[:, :, None, None].astype(x.dtype)
  return jnp.moveaxis(means, 0, 1), (counts > 0).T


def landmarks(x, num_landmarks: int, padding=None):
  """Landmarks `[b, m, h, d]` (segment means over real tokens) and their validity `[b, m]`."""
  b, n = x.shape[:2]
  weights = (
    jnp.ones((b, n), x.dtype) if padding is None else jnp.asarray(padding, bool).astype(x.dtype)
  )
  return _segment_means(x, weights, num_landmarks)


def depthwise_conv_skip(v, conv_kernel):
  """Per-head depthwise convolution of `v` `[b, n, h, dv]` along the sequence.

  `conv_kernel` `[kernel_size, heads]`: one filter per head shared by its
  channels, 'same' zero padding (as the official `Conv2d(h, h, (K, 1),
  groups=h)`); out[i] = sum_t w[t] v[i + t - kernel_size // 2].
  """
  b, n, h, dv = v.shape
  ks = conv_kernel.shape[0]
  if conv_kernel.shape != (ks, h):
    raise ValueError(f'conv_kernel must be [kernel_size, heads={h}], got {conv_kernel.shape}')
  rhs = jnp.repeat(conv_kernel.astype(v.dtype), dv, axis=1)[:, None, :]  # [K, 1, h*dv]
  out = lax.conv_general_dilated(
    v.reshape(b, n, h * dv),
    rhs,
    window_strides=(1,),
    padding=[(ks // 2, ks - 1 - ks // 2)],
    dimension_numbers=('NWC', 'WIO', 'NWC'),
    feature_group_count=h * dv,
  )
  return out.reshape(b, n, h, dv)


def _query_padding(mask, batch: int, q_length: int, kv_length: int):
  """Which queries form the query landmarks `[batch, q_length]` (None: all).

  A query is left out when a 4-D mask's query axis gives it no key, and, when
  q_length == kv_length, when its position is a padded key: in self-attention
  that token is padding, whatever form the mask takes (`[batch, kv_length]`,
  flax's `[batch, 1, 1, kv_length]` or `make_attention_mask(ones, valid)`), and
  its content must not move the landmarks of the real queries. (In
  cross-attention of equal lengths this only narrows the landmarks to fewer
  queries: every output is still a Nystrom approximation of its own row.)
  """
  if mask is None:
    return None
  mask = jnp.asarray(mask, bool)
  real = jnp.ones((batch, q_length), bool)
  if mask.ndim == 4 and mask.shape[2] == q_length and q_length > 1:
    real = jnp.broadcast_to(jnp.any(mask, axis=(1, 3)), (batch, q_length))
  padding = masking.key_padding_from_mask(mask, batch, kv_length) if q_length == kv_length else None
  return real if padding is None else real & padding


def nystrom_attention(
  q,
  k,
  v,
  num_landmarks: int,
  mask=None,
  pinv_iterations: int = 6,
  scale: Optional[float] = None,
  conv_kernel=None,
):
  """Nystromformer attention F A^+ (B V) with m = num_landmarks landmarks.

  Landmarks are means of q and k over m contiguous segments; token i belongs to
  segment floor(i m / n), so lengths not divisible by m give segments of
  n // m or n // m + 1 tokens (none empty). `num_landmarks` is clamped to
  min(q_length, kv_length).

  Masking (only key padding can be honoured; a flax mask `[batch, heads,
  q_length, kv_length]` is reduced by `masking.key_padding_from_mask`):
  padded keys are left out of the key landmark means and get zero weight in B,
  so changing k or v there changes nothing. Padded queries are left out of the
  query landmark means too (as the paper's code masks Q before forming them);
  they are read from a 4-D mask's query axis and, when q_length == kv_length
  (self-attention), from the key padding as well, whatever the mask's form
  (`_query_padding`). A landmark whose segment has
  no real token is masked out of F, A and B (its row and column of A are 0 and
  stay 0 in A^+). Outputs at padded query positions are not meaningful.

  Numerics: the three softmaxes, the pseudo-inverse and the products run in
  float32 (or wider) for any input dtype; the result has the dtype of `v`.

  Args:
    q: `[batch, q_length, heads, head_dim]`.
    k: `[batch, kv_length, heads, head_dim]`.
    v: `[batch, kv_length, heads, v_dim]`.
    num_landmarks: m.
    mask: optional bool key padding `[batch, kv_length]` or flax-style mask.
    pinv_iterations: iterations of `iterative_pinv` (6 in the paper).
    scale: score scale, default 1/sqrt(head_dim).
    conv_kernel: optional `[kernel_size, heads]` depthwise convolution of the
      (padding-zeroed) values added to the output (self-attention only).

  Returns:
    `[batch, q_length, heads, v_dim]`, dtype of `v`.
  """
  masking.check_inputs(q, k, v, mask, name='Nystrom attention')
  b, lq, h, _ = q.shape
  lk = k.shape[1]
  registry.check_arguments('nystrom', 'nystrom_attention', num_landmarks=num_landmarks)
  m = min(num_landmarks, lq, lk)
  compute = jnp.promote_types(jnp.promote_types(q.dtype, v.dtype), jnp.float32)
  qc, kc, vc = q.astype(compute), k.astype(compute), v.astype(compute)
  k_pad = masking.key_padding_from_mask(mask, b, lk)
  q_pad = _query_padding(mask, b, lq, lk)

  q_land, q_valid = landmarks(qc, m, q_pad)  # [b, m, h, d], [b, m]
  k_land, k_valid = landmarks(kc, m, k_pad)

  f = softmax_weights(qc, k_land, mask=k_valid, scale=scale)  # [b, h, lq, m]
  a_mask = q_valid[:, None, :, None] & k_valid[:, None, None, :]
  a = softmax_weights(q_land, k_land, mask=a_mask, scale=scale)  # [b, h, m, m]
  b_mask = q_valid[:, None, :, None]
  if k_pad is not None:
    b_mask = b_mask & k_pad[:, None, None, :]
  bw = softmax_weights(q_land, kc, mask=b_mask, scale=scale)  # [b, h, m, lk]

  z = iterative_pinv(a, pinv_iterations)
  bv = jnp.einsum('bhmk,bkhd->bhmd', bw, vc)
  out = jnp.einsum('bhqm,bhmd->bqhd', f, z @ bv)
  if conv_kernel is not None:
    if lq != lk:
      raise ValueError(f'the convolution skip needs q_length == kv_length, got {lq} and {lk}')
    out = out + depthwise_conv_skip(masking.zero_padded(vc, k_pad), conv_kernel)
  return out.astype(v.dtype)


@registry.register
class Nystrom(registry.Mechanism):
  """With `conv_kernel_size` (the paper uses 33), a learned depthwise convolution
  of the values, 'conv_kernel' `[conv_kernel_size, heads]`, is added to the output."""

  name = 'nystrom'
  rotary = 'scores'
  description = 'Nystrom landmarks and an iterative pseudo-inverse'
  citation = 'Xiong et al. 2021'
  options = (
    registry.Option(
      'num_landmarks', 32, int, 'landmarks m (shorter sequences use their length: exact)', minimum=1
    ),
    registry.Option('pinv_iterations', 6, int, 'iterations of the pseudo-inverse', minimum=1),
    registry.Option(
      'conv_kernel_size',
      None,
      int,
      'depthwise convolution skip of the values; None: none',
      minimum=1,
      allow_none=True,
    ),
    SCALE,
  )
  complexity = ('O(n m d + m^3)', 'O(n m)')
  whole_sequence = 'its landmarks are segment means over the whole sequence'
  no_segments = 'its landmarks are segment means that span documents'
  knob = ('num_landmarks', (8, 16, 32, 64, 128, 256, 'n'))
  example = {'num_landmarks': 4}

  def params(self, options, *, heads, head_dim, max_length, causal):
    if options.conv_kernel_size is None:
      return {}
    init = jax.nn.initializers.variance_scaling(1 / 3, 'fan_in', 'uniform')
    return {'conv_kernel': registry.ParamSpec((options.conv_kernel_size, heads), init)}

  def exact_options(self, length):
    return {'num_landmarks': length, 'pinv_iterations': 30}

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return nystrom_attention(
      q,
      k,
      v,
      options.num_landmarks,
      mask=mask,
      pinv_iterations=options.pinv_iterations,
      scale=options.scale,
      conv_kernel=params.get('conv_kernel'),
    )

"""gMLP's spatial gating unit (Liu et al. 2021) in the attention-mechanism slot.

gMLP ("Pay Attention to MLPs") mixes tokens with a learned length-by-length
matrix W and bias b, gating the result elementwise:

  s(Z) = Z1 * (W Norm(Z2) + b),

where Z1 and Z2 are two projections of the tokens (the paper splits one
projection in two halves). Here Z1 is the query and Z2 the value of each head,
both `[batch, n, heads, head_dim]` (so q and v must have the same width), and
Norm is a layer norm over each token's heads x v_dim channels with no affine
(a per-channel scale would fold into the query projection that gates it):

  out[i] = q[i] * (sum_j W[i, j] Norm(v)[j] + b[i]).

One W `[max_length, max_length]` and b `[max_length]` are shared by every
channel, as in the paper; W starts near zero and b at one, so that the unit
starts as the identity gate q * 1 (the paper's initialisation). k is unused.
Time O(n^2 d) and memory O(n^2) per layer; W is shaped by `max_length`, so the
mechanism is fixed-length. Inputs shorter than max_length use W[:n, :n] and
b[:n], the same as zero-padding the sequence to max_length.

Key padding: a padded token's column of W is dropped (its normalised value is
zeroed before mixing), so it moves no real output; outputs at padded positions
are not zero. Causal form: the paper trains bidirectionally (ImageNet, masked
language modelling); the causal form restricts W to its lower triangle
(W[i, j] = 0 for j > i), which is the spatial gating unit with no look-ahead.
Rotary positions do not apply (no q . k scores).
"""

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops import masking

LAYER_NORM_EPSILON = 1e-5


def spatial_gating(q, k, v, spatial_kernel, spatial_bias, mask=None, causal: bool = False):
  """q * (W Norm(v) + b) over the sequence, shapes as `Mechanism.attend`.

  Computed in float32 (or wider), returned in v's dtype.

  Args:
    q: gates `[batch, n, heads, head_dim]`.
    k: `[batch, n, heads, head_dim]`, unused but for its shape.
    v: mixed values `[batch, n, heads, head_dim]` (v_dim must equal head_dim).
    spatial_kernel: W `[max_length, max_length]` (output position, input position),
      max_length >= n.
    spatial_bias: b `[max_length]`.
    mask: optional bool key padding `[batch, n]` or flax-style mask (reduced with
      `masking.key_padding_from_mask`): padded tokens' normalised values are zeroed.
    causal: use the lower triangle of W only (no look-ahead).

  Returns:
    `[batch, n, heads, head_dim]`, dtype of `v`.

  Time O(n^2 heads head_dim), memory O(n^2).
  """
  masking.check_inputs(q, k, v, mask, name='spatial_gating', same_length=True)
  b, n, h, dv = v.shape
  if q.shape[-1] != dv:
    raise ValueError(
      f'spatial_gating gates the values with the queries, so q and v need the '
      f'same head_dim: got q {tuple(q.shape)}, v {tuple(v.shape)}'
    )
  length = spatial_kernel.shape[-1]
  if spatial_kernel.shape != (length, length) or spatial_bias.shape != (length,):
    raise ValueError(
      f'spatial_gating needs spatial_kernel [max_length, max_length] and '
      f'spatial_bias [max_length], got {tuple(spatial_kernel.shape)} and '
      f'{tuple(spatial_bias.shape)}'
    )
  if n > length:
    raise ValueError(f'gMLP input length {n} exceeds max_length {length} of its spatial matrix')
  compute = jnp.promote_types(jnp.promote_types(v.dtype, spatial_kernel.dtype), jnp.float32)
  x = v.astype(compute).reshape(b, n, h * dv)
  x = x - jnp.mean(x, axis=-1, keepdims=True)
  x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + LAYER_NORM_EPSILON)
  x = masking.zero_padded(x, masking.key_padding_from_mask(mask, b, n))
  w = spatial_kernel[:n, :n].astype(compute)
  if causal:
    w = jnp.tril(w)
  mixed = jnp.einsum('ij,bjc->bic', w, x) + spatial_bias[:n, None].astype(compute)
  out = q.astype(compute) * mixed.reshape(b, n, h, dv)
  return out.astype(v.dtype)


def spatial_kernel_init(key, shape, dtype=jnp.float32):
  """W near zero: uniform in +-1e-3 / max_length (the paper: "near-zero values")."""
  bound = 1e-3 / shape[-1]
  return jax.random.uniform(key, shape, dtype, -bound, bound)


@registry.register
class GMLP(registry.Mechanism):
  """Parameters: 'spatial_kernel' W `[max_length, max_length]`, 'spatial_bias' b
  `[max_length]` (ones), shared by all heads and channels."""

  name = 'gmlp'
  description = "gMLP's spatial gating unit: q * (W norm(v) + b)"
  citation = 'Liu et al. 2021'
  causal = True
  fixed_length = True
  self_attention_only = True
  complexity = ('O(n^2 d)', 'O(n^2)')
  whole_sequence = 'its spatial weights W [max_length, max_length] mix every position'
  no_segments = 'its spatial weights mix every position of the row, across documents'

  def params(self, options, *, heads, head_dim, max_length, causal):
    return {
      'spatial_kernel': registry.ParamSpec((max_length, max_length), spatial_kernel_init),
      'spatial_bias': registry.ParamSpec((max_length,), jax.nn.initializers.ones),
    }

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return spatial_gating(
      q, k, v, params['spatial_kernel'], params['spatial_bias'], mask=mask, causal=causal
    )

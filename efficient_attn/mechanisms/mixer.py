"""MLP-Mixer's token-mixing MLP (Tolstikhin et al. 2021) in the attention-mechanism slot.

MLP-Mixer mixes tokens with a two-layer MLP applied along the sequence, the
same MLP for every channel:

  out[:, c] = W2 GELU(W1 v[:, c] + b1) + b2,

with W1 `[hidden, max_length]`, W2 `[max_length, hidden]` (the paper's token
MLP of width D_S), applied to each channel c of the values (heads x v_dim); q
and k are unused, and the block's layer norm and residual are the model's. As
in the official Flax code, GELU is the tanh approximation and the weights start
LeCun-normal with zero biases. Time O(n hidden d) and memory O(n hidden) per
head; W1 and W2 are shaped by `max_length`, so the mechanism is fixed-length.
Inputs shorter than max_length use the first n columns of W1 and rows of W2,
the same as zero-padding the sequence to max_length.

Key padding: padded tokens' values are zeroed before W1, so they move no real
output; outputs at padded positions are not zero. There is no causal form (the
hidden units read every position), and rotary positions do not apply.
"""

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops import masking


def token_mixing(q, k, v, w1, b1, w2, b2, mask=None, causal: bool = False):
  """W2 GELU(W1 v + b1) + b2 along the sequence, per channel; shapes as `Mechanism.attend`.

  Computed in float32 (or wider), returned in v's dtype.

  Args:
    q: `[batch, n, heads, head_dim]`, unused but for its shape.
    k: `[batch, n, heads, head_dim]`, unused.
    v: `[batch, n, heads, v_dim]`.
    w1: `[max_length, hidden]` (flax Dense layout: input position, hidden unit).
    b1: `[hidden]`.
    w2: `[hidden, max_length]`.
    b2: `[max_length]`.
    mask: optional bool key padding `[batch, n]` or flax-style mask (reduced with
      `masking.key_padding_from_mask`); values at padded positions are zeroed.
    causal: must be False (the token MLP has no causal form).

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`.

  Time O(n hidden heads v_dim), memory O(hidden heads v_dim) per example.
  """
  if causal:
    raise ValueError(
      'token_mixing has no causal form (causal=True given): its hidden '
      'units read every position of the sequence'
    )
  masking.check_inputs(q, k, v, mask, name='token_mixing', same_length=True)
  b, n, h, dv = v.shape
  length, hidden = w1.shape
  if w2.shape != (hidden, length) or b1.shape != (hidden,) or b2.shape != (length,):
    raise ValueError(
      f'token_mixing needs w1 [max_length, hidden], b1 [hidden], w2 [hidden, '
      f'max_length], b2 [max_length], got {tuple(w1.shape)}, {tuple(b1.shape)},'
      f' {tuple(w2.shape)}, {tuple(b2.shape)}'
    )
  if n > length:
    raise ValueError(f'Mixer input length {n} exceeds max_length {length} of its token MLP')
  compute = jnp.promote_types(jnp.promote_types(v.dtype, w1.dtype), jnp.float32)
  x = masking.zero_padded(v.astype(compute), masking.key_padding_from_mask(mask, b, n))
  hid = jnp.einsum('bnhc,nu->buhc', x, w1[:n].astype(compute))
  hid = jax.nn.gelu(hid + b1.astype(compute)[:, None, None], approximate=True)
  out = jnp.einsum('buhc,un->bnhc', hid, w2[:, :n].astype(compute))
  return (out + b2[:n, None, None].astype(compute)).astype(v.dtype)


@registry.register
class Mixer(registry.Mechanism):
  """Parameters: 'token_kernel_1' W1 `[max_length, hidden]`, 'token_bias_1' `[hidden]`,
  'token_kernel_2' W2 `[hidden, max_length]`, 'token_bias_2' `[max_length]`, shared by all
  heads and channels (the paper ties the token MLP across channels)."""

  name = 'mixer'
  description = "MLP-Mixer's token-mixing MLP over the sequence"
  citation = 'Tolstikhin et al. 2021'
  options = (registry.Option('token_hidden', 256, int, 'token-mixing MLP width D_S', minimum=1),)
  fixed_length = True
  self_attention_only = True
  complexity = ('O(n D_S d)', 'O(n D_S)')
  whole_sequence = "its token-mixing MLP's weights are shaped by the whole sequence (max_length)"
  no_segments = 'its token-mixing MLP mixes every position of the row, across documents'
  example = {'token_hidden': 8}

  def params(self, options, *, heads, head_dim, max_length, causal):
    kernel = jax.nn.initializers.lecun_normal()
    zeros = jax.nn.initializers.zeros
    return {
      'token_kernel_1': registry.ParamSpec((max_length, options.token_hidden), kernel),
      'token_bias_1': registry.ParamSpec((options.token_hidden,), zeros),
      'token_kernel_2': registry.ParamSpec((options.token_hidden, max_length), kernel),
      'token_bias_2': registry.ParamSpec((max_length,), zeros),
    }

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return token_mixing(
      q,
      k,
      v,
      params['token_kernel_1'],
      params['token_bias_1'],
      params['token_kernel_2'],
      params['token_bias_2'],
      mask=mask,
      causal=causal,
    )

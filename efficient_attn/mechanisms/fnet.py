"""FNet Fourier token mixing (Lee-Thorp et al. 2021) in the attention-mechanism slot.

FNet replaces self-attention by a parameter-free 2-D discrete Fourier
transform, keeping the real part:

  out = Re(FFT_seq(FFT_hidden(x)))

Here x is the value tensor `[batch, n, heads, v_dim]` with its hidden axis
heads x v_dim flattened (q and k are ignored, so the surrounding layer's value
projection feeds the mixing). Time O(n H log(n H)) and memory O(n H) per
example, H = heads * v_dim; no parameters.

Key padding: the values at padded positions are zeroed before the transforms,
so a padded token moves no output. Outputs at real positions still depend on
the padded length n (the DFT is over all n positions: its frequencies k / n
change with n), so the same sentence padded to two lengths mixes differently;
outputs at padded positions are not zero. There is no causal form: every output
mixes every position.
"""

import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops import masking


def fnet_mixing(q, k, v, mask=None, causal: bool = False):
  """Re(FFT over the sequence of FFT over heads x v_dim) of the values.

  Computed in float32 (or float64 for float64 values), returned in v's dtype.

  Args:
    q: `[batch, n, heads, head_dim]`, ignored but for its length.
    k: `[batch, n, heads, head_dim]`, ignored.
    v: `[batch, n, heads, v_dim]`.
    mask: optional bool key padding `[batch, n]` or flax-style mask (reduced
      with `masking.key_padding_from_mask`); values at padded positions are
      zeroed before mixing.
    causal: must be False (FNet has no causal form).

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`.

  Time O(n H log(n H)), memory O(n H) per example, H = heads * v_dim.
  """
  if causal:
    raise ValueError(
      'fnet_mixing has no causal form (causal=True given): the Fourier '
      'transform over the sequence mixes every position into every output'
    )
  masking.check_inputs(q, k, v, mask, name='fnet_mixing', same_length=True)
  b, n, h, dv = v.shape
  compute = jnp.promote_types(v.dtype, jnp.float32)
  x = v.astype(compute).reshape(b, n, h * dv)
  x = masking.zero_padded(x, masking.key_padding_from_mask(mask, b, n))
  y = jnp.real(jnp.fft.fft(jnp.fft.fft(x, axis=-1), axis=1))
  return y.reshape(b, n, h, dv).astype(v.dtype)


@registry.register
class FNet(registry.Mechanism):
  name = 'fnet'
  description = 'parameter-free Fourier token mixing'
  citation = 'Lee-Thorp et al. 2021'
  self_attention_only = True
  complexity = ('O(n d log(n d))', 'O(n d)')
  whole_sequence = 'its Fourier transform runs over the whole sequence'
  no_segments = 'its Fourier transform mixes every position of the row'

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return fnet_mixing(q, k, v, mask=mask, causal=causal)

"""Linformer attention (Wang et al., 2020): learned projections along the sequence.

Keys and values are compressed from n tokens to k_proj "tokens" by learned
matrices E, F `[k_proj, max_length]`, K' = E K and V' = F V, and the queries
attend exactly (softmax) to the k_proj compressed keys:

  out = softmax(Q (E K)^T * scale) (F V).

Time O(n k_proj d) and memory O(n k_proj) per head instead of O(n^2). The
projections are shaped by `max_length`, so the mechanism is fixed-length; it is
not causal (every compressed key mixes all positions, future ones included).
Shapes follow `efficient_attn.registry.Mechanism.attend`.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import masking
from efficient_attn.ops.scaled_dot_product import softmax_attention

SHARING_MODES = ('none', 'headwise', 'kv', 'layerwise')


def _as_3d(proj, heads: int, name: str) -> jnp.ndarray:
  """`[k_proj, n]` or `[heads|1, k_proj, n]` -> `[heads|1, k_proj, n]`."""
  proj = jnp.asarray(proj)
  if proj.ndim == 2:
    proj = proj[None]
  if proj.ndim != 3 or proj.shape[0] not in (1, heads):
    raise ValueError(
      f'{name} must be [k_proj, max_length] or [heads (={heads}) or 1, '
      f'k_proj, max_length], got shape {proj.shape}'
    )
  return proj


def project_sequence(x, proj, key_padding=None):
  """Compress `x` `[batch, n, heads, dim]` along the sequence with `proj`.

  Args:
    x: keys or values `[batch, n, heads, dim]`.
    proj: `[k_proj, max_length]` or `[heads|1, k_proj, max_length]`, with
      max_length >= n; only its first n columns are used, which equals
      zero-padding `x` to max_length.
    key_padding: optional bool `[batch, n]`, True for real tokens; padded rows of
      `x` are zeroed before projecting.

  Returns:
    `[batch, k_proj, heads, dim]` in float32 (or wider).
  """
  n = x.shape[1]
  proj = _as_3d(proj, x.shape[2], 'projection')
  if n > proj.shape[-1]:
    raise ValueError(
      f'Linformer input length {n} exceeds max_length {proj.shape[-1]} of its projections'
    )
  compute = jnp.promote_types(jnp.promote_types(x.dtype, proj.dtype), jnp.float32)
  x = masking.zero_padded(x, key_padding).astype(compute)
  return jnp.einsum('hpn,bnhd->bphd', proj[..., :n].astype(compute), x)


def linformer_attention(q, k, v, e_proj, f_proj, mask=None, scale: Optional[float] = None):
  """softmax(q (E k)^T * scale) (F v), exact softmax over k_proj projected keys.

  Time O(n k_proj d), memory O(n k_proj) per head (plus O(k_proj max_length) for
  E and F). The projections and the softmax run in float32 (or wider); the
  result has the dtype of `v`.

  Inputs shorter than the projections' max_length use the first n columns of E
  and F, the same as zero-padding the sequence to max_length (this is also what
  the official fairseq implementation does). Longer inputs raise ValueError.

  Masking: only key padding can be honoured (the q x n matrix is never formed).
  A flax-style mask `[batch, heads, q_length, kv_length]` is reduced with
  `masking.key_padding_from_mask`; keys and values at padded positions are
  zeroed before projecting, so they do not contribute to E k or F v. As in the
  official implementation (which zeroes padded token embeddings before the
  layer and applies no mask after compression), the k_proj compressed keys
  themselves are all attended to; padded positions simply carry no content.

  Args:
    q: `[batch, q_length, heads, head_dim]`.
    k: `[batch, n, heads, head_dim]`.
    v: `[batch, n, heads, v_dim]`.
    e_proj: key projection E, `[k_proj, max_length]` (shared by heads) or
      `[heads|1, k_proj, max_length]`.
    f_proj: value projection F, same shapes as `e_proj` (may be the same array).
    mask: optional bool key padding `[batch, n]` or flax-style mask; True = attend.
    scale: score scale, default 1/sqrt(head_dim).

  Returns:
    `[batch, q_length, heads, v_dim]`, dtype of `v`.
  """
  masking.check_inputs(q, k, v, mask, name='Linformer attention')
  b, n = k.shape[0], k.shape[1]
  key_padding = masking.key_padding_from_mask(mask, b, n)
  k_c = project_sequence(k, e_proj, key_padding)
  v_c = project_sequence(v, f_proj, key_padding)
  out = softmax_attention(q, k_c, v_c, scale=scale)
  return out.astype(v.dtype)


def linformer_projection_init(key, shape, dtype=jnp.float32):
  """Initialiser of E and F `[..., k_proj, max_length]`: Xavier-uniform, gain 1/sqrt(2).

  This is the official (fairseq) initialisation of the compression matrices;
  fan-in is max_length, fan-out k_proj, leading axes (heads) are batch axes.
  The variance 1 / (k_proj + max_length) keeps E k at about the scale of k.
  """
  batch_axis = tuple(range(len(shape) - 2))
  return jax.nn.initializers.variance_scaling(
    0.5, 'fan_avg', 'uniform', in_axis=-1, out_axis=-2, batch_axis=batch_axis
  )(key, shape, dtype)


@registry.register
class Linformer(registry.Mechanism):
  """Parameters by `sharing` (Wang et al. 2020, section 4):

    'none': separate E and F per head, 'e_proj', 'f_proj' `[heads, k, max_length]`;
    'headwise': one E and one F for all heads (the official implementation's
      default), 'e_proj', 'f_proj' `[k, max_length]`;
    'kv': one matrix E = F for keys and values, 'kv_proj' `[k, max_length]`;
    'layerwise': E = F = one 'kv_proj' `[k, max_length]` shared by every layer
      of a model: the encoder creates it once (`shared_params`) and passes it
      to each layer (`MultiHeadAttention(shared_params=...)`).

  k = min(k_proj, max_length).
  """

  name = 'linformer'
  rotary = 'scores'
  description = 'learned length projections E, F (n -> k)'
  citation = 'Wang et al. 2020'
  options = (
    registry.Option('k_proj', 64, int, 'projected length k', minimum=1),
    registry.Option('sharing', 'headwise', str, 'how E and F are shared', choices=SHARING_MODES),
    SCALE,
  )
  fixed_length = True
  complexity = ('O(n k d)', 'O(n k)')
  whole_sequence = 'its projections E and F compress keys and values along the whole sequence'
  no_segments = 'its projections E and F mix the keys of every document of the row'
  knob = ('k_proj', (16, 32, 64, 128, 256, 'n'))
  example = {'k_proj': 8}

  def _shape(self, options, max_length):
    return (min(options.k_proj, max_length), max_length)

  def params(self, options, *, heads, head_dim, max_length, causal):
    shape = self._shape(options, max_length)
    init = linformer_projection_init
    if options.sharing == 'none':
      return {
        'e_proj': registry.ParamSpec((heads,) + shape, init),
        'f_proj': registry.ParamSpec((heads,) + shape, init),
      }
    if options.sharing == 'headwise':
      return {'e_proj': registry.ParamSpec(shape, init), 'f_proj': registry.ParamSpec(shape, init)}
    if options.sharing == 'kv':
      return {'kv_proj': registry.ParamSpec(shape, init)}
    return {}

  def shared_params(self, options, *, heads, head_dim, max_length):
    if options.sharing != 'layerwise':
      return {}
    return {
      'kv_proj': registry.ParamSpec(self._shape(options, max_length), linformer_projection_init)
    }

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    if 'kv_proj' in params:
      e = f = params['kv_proj']
    elif options.sharing == 'layerwise':
      raise ValueError(
        "Linformer sharing='layerwise' needs the model's shared 'kv_proj' "
        '[k, max_length]: pass MultiHeadAttention(shared_params=...) or use '
        'the Encoder, which creates it'
      )
    else:
      e, f = params['e_proj'], params['f_proj']
    return linformer_attention(q, k, v, e, f, mask=mask, scale=options.scale)

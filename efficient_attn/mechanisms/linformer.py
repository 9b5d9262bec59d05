"""Linformer attention (Wang et al., 2020): learned projections along the sequence.

Keys and values are compressed from n tokens to k_proj "tokens" by learned
matrices E, F `[k_proj, max_length]`, K' = E K and V' = F V, and the queries
attend exactly (softmax) to the k_proj compressed keys:

  out = softmax(Q (E K)^T * scale) (F V).

Time O(n k_proj d) and memory O(n k_proj) per head instead of O(n^2). The
projections are shaped by `max_length`, so the mechanism is fixed-length; it is
not causal (every compressed key mixes all positions, future ones included).
Shapes follow `efficient_attn.mechanisms.base.Mechanism`.
"""
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn import masking
from efficient_attn.mechanisms.base import Mechanism
from efficient_attn.mechanisms.softmax import softmax_attention

SHARING_MODES = ('none', 'headwise', 'kv', 'layerwise')


def _as_3d(proj, heads: int, name: str) -> jnp.ndarray:
  """`[k_proj, n]` or `[heads|1, k_proj, n]` -> `[heads|1, k_proj, n]`."""
  proj = jnp.asarray(proj)
  if proj.ndim == 2:
    proj = proj[None]
  if proj.ndim != 3 or proj.shape[0] not in (1, heads):
    raise ValueError(f'{name} must be [k_proj, max_length] or [heads (={heads}) or 1, '
                     f'k_proj, max_length], got shape {proj.shape}')
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
    raise ValueError(f'Linformer input length {n} exceeds max_length {proj.shape[-1]} '
                     f'of its projections')
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
  return nn.initializers.variance_scaling(
      0.5, 'fan_avg', 'uniform', in_axis=-1, out_axis=-2,
      batch_axis=batch_axis)(key, shape, dtype)


class LinformerAttention(Mechanism):
  """Linen Linformer with learned E, F `[.., k_proj, max_length]`.

  Attributes:
    k_proj: projected length; the parameters use min(k_proj, max_length).
    sharing: how E and F are shared (paper section 4):
      'none': separate E and F per head, params `e_proj`, `f_proj`
        `[heads, k_proj, max_length]`;
      'headwise': one E and one F for all heads (the official implementation's
        default), params `[k_proj, max_length]`;
      'kv': one matrix E = F for all heads and for keys and values, param
        `kv_proj` `[k_proj, max_length]`;
      'layerwise': E = F = `shared_projection`, an array that the model creates
        once (e.g. `self.param('linformer_proj', linformer_projection_init,
        (k, l))` in the top-level module) and passes to every layer; this
        module then creates no parameters.
    shared_projection: the array used by 'layerwise' sharing, `[k_proj,
      max_length]` or `[heads|1, k_proj, max_length]`.
    scale: score scale, default 1/sqrt(head_dim).

  `max_length` (inherited) is required; `causal=True` is refused.
  """
  k_proj: int = 64
  sharing: str = 'headwise'
  shared_projection: Optional[Any] = None
  scale: Optional[float] = None

  @nn.compact
  def __call__(self, q, k, v, mask=None, deterministic: bool = True):
    del deterministic
    if self.causal:
      raise ValueError('LinformerAttention does not support causal=True: the projections '
                       'E, F mix all sequence positions, so every compressed key would '
                       'carry information from future tokens')
    if self.sharing not in SHARING_MODES:
      raise ValueError(f'Unknown Linformer sharing {self.sharing!r}; valid: '
                       f'{", ".join(SHARING_MODES)}')
    if self.max_length is None:
      raise ValueError('LinformerAttention needs max_length (the length its projections '
                       'E, F are built for); got max_length=None')
    n = k.shape[1]
    if n > self.max_length:
      raise ValueError(f'Linformer input length {n} exceeds max_length={self.max_length}')
    heads = k.shape[2]
    kp = min(self.k_proj, self.max_length)
    init = linformer_projection_init
    shape2 = (kp, self.max_length)
    if self.sharing == 'none':
      e = self.param('e_proj', init, (heads,) + shape2, self.param_dtype)
      f = self.param('f_proj', init, (heads,) + shape2, self.param_dtype)
    elif self.sharing == 'headwise':
      e = self.param('e_proj', init, shape2, self.param_dtype)
      f = self.param('f_proj', init, shape2, self.param_dtype)
    elif self.sharing == 'kv':
      e = f = self.param('kv_proj', init, shape2, self.param_dtype)
    else:  # layerwise
      if self.shared_projection is None:
        raise ValueError("LinformerAttention sharing='layerwise' needs shared_projection "
                         '(one [k_proj, max_length] array passed to every layer)')
      e = f = jnp.asarray(self.shared_projection)
      if e.shape[-1] != self.max_length:
        raise ValueError(f'shared_projection has length {e.shape[-1]}, expected '
                         f'max_length={self.max_length}')
    dtype = self.dtype or q.dtype
    if self.dtype is not None:
      e, f = e.astype(dtype), f.astype(dtype)
    return linformer_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), e, f,
                               mask=mask, scale=self.scale)

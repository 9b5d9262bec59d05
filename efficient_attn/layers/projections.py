"""Projection schemes of "You Need to Pay Better Attention" (Hosseini & Hosseini 2024).

A scheme turns the layer inputs into per-head queries, keys and values
`[batch, length, heads, head_dim]`; the output projection W_O is common to all
schemes and lives in `attention.MultiHeadAttention`. With model width d_m:

  standard   Q W_Q, K W_K, V W_V                  4 (d_m^2 + d_m) params with W_O
  optimised  Q W_Q, K W_K, V sliced into heads     3 (d_m^2 + d_m)
  efficient  Q W_Q, K and V sliced into heads      2 (d_m^2 + d_m)
  super      efficient, then V'_i = W_A V_i + b_A  2 (d_m^2 + d_m) + l^2 + l
             (W_A: l x l shared by all heads; lower-triangular when causal)

Parameter names match `flax.linen.MultiHeadDotProductAttention` ('query',
'key', 'value', 'out'), so checkpoints of the standard scheme are interchangeable.
"""

from typing import Any, Callable, Optional, Tuple

import flax.linen as nn
from jax import lax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.layers import non_finite
from efficient_attn.ops import masking


def split_heads(x: jnp.ndarray, num_heads: int, name: str) -> jnp.ndarray:
  """`[batch, length, num_heads * head_dim]` -> `[batch, length, num_heads, head_dim]`."""
  features = x.shape[-1]
  if features % num_heads:
    raise ValueError(
      f'{name} has {features} features, which num_heads={num_heads} '
      f'does not divide; choose heads that divide the model width'
    )
  return x.reshape(x.shape[:-1] + (num_heads, features // num_heads))


def identity_init(key, shape, dtype=jnp.float32):
  """W_A starts as the identity, so a fresh super layer equals an efficient one."""
  del key
  return jnp.eye(shape[0], shape[1], dtype=dtype)


class AlignmentKernel(nn.Module):
  """Super Attention's W_A as a Linen module (parameters 'kernel' `[l, l]`, 'bias' `[l]`).

  Attributes:
    max_length: l, the context length W_A is built for (l x l kernel, l biases).
      Shorter inputs use the leading n x n block; longer ones are an error.
    causal: keep W_A lower-triangular so token t only mixes tokens <= t.
  """

  max_length: int
  causal: bool = False
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable[..., Any] = identity_init
  bias_init: Callable[..., Any] = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self, v: jnp.ndarray, index=None, count: int = 1) -> jnp.ndarray:
    """See `align`."""
    l = self.max_length
    kernel = self.param('kernel', self.kernel_init, (l, l), self.param_dtype)
    bias = self.param('bias', self.bias_init, (l,), self.param_dtype)
    return align(kernel, bias, v, causal=self.causal, dtype=self.dtype, index=index, count=count)


def align(
  kernel, bias, v: jnp.ndarray, *, causal: bool, dtype: Any = None, index=None, count: int = 1
) -> jnp.ndarray:
  """Super Attention's value mixing `V' = W_A V + b_A` along the sequence.

  Args:
    kernel: W_A `[l, l]`; bias: b_A `[l]` (l = max_length). Inputs shorter than
      l use the leading n x n block; longer ones are an error.
    v: `[batch, n, heads, head_dim]`.
    causal: use the lower triangle of W_A only (token t mixes tokens <= t).
    index: causal decoding: v holds the raw values of positions 0..n-1 (those
      after `index + count - 1` are ignored) and only the output rows `index` ..
      `index + count - 1` are computed (`count` > 1: a prefill).
  Returns:
    `[batch, n, heads, head_dim]`, or `[batch, count, heads, head_dim]` with `index`.
  """
  n, l = v.shape[1], kernel.shape[0]
  if n > l:
    raise ValueError(
      f'sequence length {n} exceeds max_length={l} that the super '
      f'projection (l x l alignment kernel) was built for'
    )
  if index is not None and not causal:
    raise ValueError('decoding through the super projection needs causal=True')
  kernel, bias = kernel[:n, :n], bias[:n]
  reached = None
  if causal:
    kernel = jnp.tril(kernel)
    # The upper triangle's zeros would still multiply a later NaN or Inf (0 x NaN is NaN):
    # mix finite values, and mark each entry from the first non-finite one on.
    reached = jnp.cumsum(~jnp.isfinite(v), axis=1, dtype=jnp.int32) > 0
    v = non_finite.finite_or_zero(v)
  dtype = dtype or v.dtype
  nan = jnp.array(jnp.nan, dtype)
  if index is not None:
    assert reached is not None  # causal, checked above
    rows = lax.dynamic_slice_in_dim(kernel, index, count, axis=0)  # [count, n]
    out = jnp.einsum('ts,bshd->bthd', rows.astype(dtype), v.astype(dtype))
    out = out + lax.dynamic_slice_in_dim(bias, index, count).astype(dtype)[None, :, None, None]
    return jnp.where(lax.dynamic_slice_in_dim(reached, index, count, axis=1), nan, out)
  out = jnp.einsum('ts,bshd->bthd', kernel.astype(dtype), v.astype(dtype))
  out = out + bias.astype(dtype)[None, :, None, None]
  return out if reached is None else jnp.where(reached, nan, out)


def alignment_kernel(
  max_length: Optional[int], causal: bool, dtype: Any = None, param_dtype: Any = jnp.float32
) -> AlignmentKernel:
  """The super scheme's `AlignmentKernel`, named 'alignment' in the calling module."""
  if max_length is None:
    raise ValueError(
      "projection 'super' needs max_length (the context length l of its l x l alignment kernel)"
    )
  return AlignmentKernel(
    max_length=max_length, causal=causal, dtype=dtype, param_dtype=param_dtype, name='alignment'
  )


def dense_names(scheme: str, shared_qk: bool = False) -> Tuple[str, ...]:
  """The projection matrices a scheme has: 'query', then 'key' and 'value' where
  the scheme projects them (the others are sliced into heads)."""
  registry.check_projection(scheme)
  names = ['query']
  if scheme in ('standard', 'optimised') and not shared_qk:
    names.append('key')
  if scheme == 'standard':
    names.append('value')
  return tuple(names)


def project_qkv(
  scheme: str,
  inputs_q,
  inputs_k,
  inputs_v,
  *,
  num_heads: int,
  dense: Callable[[str], Callable[..., Any]],
  align: Optional[Callable[..., Any]] = None,
  dtype: Any = None,
  shared_qk: bool = False,
  normalize: Optional[Callable[[str], Callable[..., Any]]] = None,
  mask=None,
  qkv_features: Optional[int] = None,
):
  """Per-head q, k, v for a projection scheme; call inside a compact method.

  Args:
    scheme: one of `registry.PROJECTIONS`.
    inputs_q, inputs_k, inputs_v: `[batch, length, features]`.
    num_heads: h.
    dense: `dense(name)` is the `[features] -> [heads, head_dim]` projection
      named `name` (a Linen DenseGeneral or an NNX LinearGeneral of the caller),
      or to the mechanism's declared shapes (`layer.HeadLayout.features`).
    align: the super scheme's `align(v)` (its W_A); None returns the raw sliced
      values (a decoding layer aligns its cache instead).
    shared_qk: keys are the queries (Reformer): no key projection or slice.
    normalize: QK layer norm (Dehghani et al. 2023): `normalize(name)` is the
      norm named 'query_ln' or 'key_ln', applied to each head's q and k.
    mask: the layer's mask (`[batch, heads, q_length, kv_length]` broadcastable,
      or key padding `[batch, kv_length]`). The super scheme zeroes the raw
      values of the keys no query may attend to (padding) before W_A mixes them
      along the sequence, so a padded token reaches no other token's value.
    qkv_features: the attention width heads x head_dim that sliced keys and values
      must have (None: the queries' width).
  Returns:
    q `[b, lq, h, dk]`, k `[b, lk, h, dk]`, v `[b, lk, h, dk]`.
  """
  names = dense_names(scheme, shared_qk)
  q = dense('query')(inputs_q)
  k = q if shared_qk else dense('key')(inputs_k) if 'key' in names else None
  v = dense('value')(inputs_v) if 'value' in names else None
  qkv_features = qkv_features or q.shape[-2] * q.shape[-1]
  for name, x in (('inputs_k', inputs_k), ('inputs_v', inputs_v)):
    if (name == 'inputs_k' and k is None) or (name == 'inputs_v' and v is None):
      if x.shape[-1] != qkv_features:
        raise ValueError(
          f'projection {scheme!r} slices {name} into heads without a matrix, so '
          f'its width {x.shape[-1]} must equal qkv_features={qkv_features}'
        )
  if k is None:
    k = split_heads(inputs_k, num_heads, 'inputs_k')
  if v is None:
    v = split_heads(inputs_v, num_heads, 'inputs_v')
  if normalize is not None:
    q = normalize('query_ln')(q)
    k = q if shared_qk else normalize('key_ln')(k)
  if scheme == 'super' and align is not None:
    if mask is not None and jnp.shape(mask)[-1] == v.shape[1]:  # else the mechanism refuses it
      v = masking.zero_padded(v, masking.key_padding_from_mask(mask, *v.shape[:2]))
    v = align(v)
  if dtype is not None:
    q, k, v = (x.astype(dtype) for x in (q, k, v))
  return q, k, v

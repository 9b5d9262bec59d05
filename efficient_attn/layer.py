"""What a multi-head attention layer does, whichever Flax API holds its parameters.

`efficient_attn.attention` (Linen) and `efficient_attn.nnx` (NNX) own parameters
and caches each in their own way, and call these functions for everything
else: the input checks and their one-line errors, the mechanism call (dtype,
rotary positions, masks) and the decoding step. So the two layers cannot drift
apart, and a mechanism is never written twice.
"""
import warnings
from typing import Any, Callable, Dict, Optional

import jax.numpy as jnp
from jax import lax

from efficient_attn import checks
from efficient_attn import decoding
from efficient_attn import masking
from efficient_attn import registry
from efficient_attn import rotary


def resolve_inputs(inputs_q, inputs_k=None, inputs_v=None, inputs_kv=None):
  """(inputs_q, inputs_k, inputs_v) by flax's rules: k defaults to q and v to k.

  Raises ValueError for values without keys, for `inputs_kv` together with
  `inputs_k` / `inputs_v`, and for a boolean `inputs_v` (a mask passed
  positionally, flax's old call signature); `inputs_kv` warns as in flax.
  """
  if inputs_kv is not None:
    if inputs_k is not None or inputs_v is not None:
      raise ValueError('If either `inputs_k` or `inputs_v` is not None, `inputs_kv` must be '
                       'None; pass inputs_k (and inputs_v) only')
    warnings.warn('The inputs_kv arg will be deprecated soon. Use inputs_k and inputs_v '
                  'instead.', DeprecationWarning, stacklevel=3)
    inputs_k = inputs_v = inputs_kv
  if inputs_k is None and inputs_v is not None:
    raise ValueError('`inputs_k` cannot be None if `inputs_v` is not None; to use one array '
                     'for both, pass it as inputs_k and leave inputs_v None')
  if inputs_v is not None and jnp.asarray(inputs_v).dtype == jnp.bool_:
    warnings.warn("the function signature of MultiHeadDotProductAttention's `__call__` method "
                  'has changed: the mask is a keyword argument', DeprecationWarning, stacklevel=3)
    raise ValueError(f'inputs_v is a boolean array of shape {jnp.shape(inputs_v)}: is it a mask '
                     f'passed positionally? Pass it as mask=...')
  inputs_k = inputs_q if inputs_k is None else inputs_k
  inputs_v = inputs_k if inputs_v is None else inputs_v
  return inputs_q, inputs_k, inputs_v


def head_dim(num_heads: int, qkv_features: int) -> int:
  """qkv_features // num_heads, or ValueError when the heads do not divide the width."""
  if num_heads < 1 or qkv_features % num_heads:
    raise ValueError(f'num_heads={num_heads} must divide the attention width '
                     f'{qkv_features} (qkv_features / d_model)')
  return qkv_features // num_heads


def check_dropout(decl: registry.Mechanism, rate: float) -> None:
  """Refuses attention-weight dropout for a mechanism that never forms the weights."""
  if rate > 0.0 and not decl.forms_weights:
    with_weights = registry.names_where(lambda m: m.forms_weights)
    raise ValueError(
        f'dropout_rate={rate}: attention-weight dropout needs a mechanism that forms '
        f'attention weights ({", ".join(with_weights)}), not {decl.name!r}; set the '
        f'attention dropout rate to 0')


def check_causal(causal: bool) -> None:
  """Decoding needs a causal layer."""
  if not causal:
    raise ValueError('decode=True needs causal=True (a token generated one at a time '
                     'can only attend to the past)')


def check_decode(causal: bool, mask, inputs_q, inputs_k, inputs_v, stepping: bool) -> None:
  """What decoding needs: causality, no mask, self-attention, one token per step."""
  check_causal(causal)
  if mask is not None:
    raise ValueError('decode=True takes no mask (causality comes from the cache)')
  if not (inputs_q is inputs_k is inputs_v):
    raise ValueError('decode=True supports self-attention only')
  if stepping and inputs_q.shape[1] != 1:
    raise ValueError(f'a decoding step takes one token [batch, 1, features], got '
                     f'shape {inputs_q.shape} (the cache already exists)')


def check_mask(decl: registry.Mechanism, mask, q_length: int) -> None:
  """Refuses a mask a key-padding-only mechanism cannot honour (e.g. a causal mask).

  A 4-D mask `[b, h, q, k]` is key padding when it is the outer product of a
  query and a key validity (`make_attention_mask(q_valid, k_valid)`), the same
  for every head. Concrete masks are checked at once, traced ones when they run.
  """
  if decl.masks != 'key_padding' or mask is None or jnp.ndim(mask) != 4 or (
      mask.shape[2] == 1 or q_length == 1):
    return
  mask = jnp.asarray(mask, bool)
  keys = jnp.any(mask, axis=(1, 2), keepdims=True)
  queries = jnp.any(mask, axis=(1, 3), keepdims=True)
  ok = jnp.all(mask == (keys & queries))
  checks.runtime_check(
      ok, f'mechanism {decl.name!r} honours only key-padding masks, and this '
      f'[batch, heads, q_length, kv_length] mask is not one (is it a causal mask from '
      f'nn.make_causal_mask?): ask for causality with causal=True, and pass padding as '
      f'a [batch, kv_length] mask or make_attention_mask(valid, valid)')


def with_one_batch_axis(call: Callable[..., Any], inputs_q, inputs_k, inputs_v, mask,
                        *, decode: bool):
  """Runs `call(q, k, v, mask)` on inputs with 0 or several batch axes, flattened to one.

  Flax's convention: every axis before `[length, features]` is a batch axis.
  The mask is `[..., heads, q_length, kv_length]` or key padding `[..., kv_length]`.
  """
  if inputs_q.ndim < 2:
    raise ValueError(f'inputs must be [..., length, features], got shape {inputs_q.shape}')
  batch_shape = inputs_q.shape[:-2]
  if len(batch_shape) == 1:
    return call(inputs_q, inputs_k, inputs_v, mask)
  if decode:
    raise ValueError(f'decode=True takes inputs [batch, length, features], got shape '
                     f'{inputs_q.shape}')
  flat = lambda x: x.reshape((-1,) + x.shape[-2:])
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.ndim == len(batch_shape) + 3:  # [..., heads, q, k]
      mask = jnp.broadcast_to(mask, batch_shape + mask.shape[-3:])
      mask = mask.reshape((-1,) + mask.shape[-3:])
    elif mask.ndim == len(batch_shape) + 1:  # [..., k] key padding
      mask = jnp.broadcast_to(mask, batch_shape + mask.shape[-1:]).reshape(
          (-1, mask.shape[-1]))
    else:
      raise ValueError(f'mask of shape {mask.shape} does not fit inputs of shape '
                       f'{inputs_q.shape}; valid: [..., heads, q_length, kv_length] or '
                       f'[..., kv_length] with the inputs\' batch axes {batch_shape}')
  out = call(flat(inputs_q), flat(inputs_k), flat(inputs_v), mask)
  return out.reshape(batch_shape + out.shape[-2:])


def check_inputs(decl: registry.Mechanism, q, k, v, mask, *, stepping: bool = False) -> None:
  """One-line errors for inconsistent q, k, v and mask shapes (see `masking.check_inputs`)."""
  masking.check_inputs(q, k, v, mask, name=f'mechanism {decl.name!r}',
                       same_length=decl.self_attention_only and not stepping)


def run_mechanism(decl: registry.Mechanism, o: registry.Options, params: Dict[str, Any],
                  q, k, v, *, mask, causal: bool, ctx: registry.Context, use_rotary: bool,
                  dtype: Any = None, state=None, position=None):
  """The declared mechanism on projected heads: `attend`, or one decoding `step`.

  q `[batch, q_length, heads, head_dim]`, k `[batch, kv_length, heads, head_dim]`,
  v `[batch, kv_length, heads, v_dim]` -> `[batch, q_length, heads, v_dim]`; with
  `state`, one token and `(new_state, out_t)`. `params` are the declared ones
  (and any shared ones), however the wrapper stores them.
  """
  check_inputs(decl, q, k, v, mask, stepping=state is not None)
  dtype = dtype or q.dtype
  q, k, v = (x.astype(dtype) for x in (q, k, v))
  if use_rotary:
    positions = (rotary.positions_of(q.shape[1], k.shape[1]) if state is None
                 else rotary.at(position))
    if decl.rotary == 'scores':
      q, k = rotary.rotate(q, positions[0]), rotary.rotate(k, positions[1])
    else:
      ctx.positions, ctx.position = positions, position
  if state is not None:
    return decl.step(o, params, state, q, k, v, ctx=ctx)
  check_mask(decl, mask, q.shape[1])
  return decl.attend(o, params, q, k, v, mask=mask, causal=causal, ctx=ctx)


CACHE_NAMES = ('index', 'state', 'values')


def init_cache(form: decoding.DecodeForm, *, batch: int, length: int, heads: int,
               head_dim: int, dtype: Any, super_values: bool) -> Dict[str, Any]:
  """An empty decoding cache for `length` tokens: 'index', 'state' and, for the
  super projection, 'values' (the raw values its lower-triangular W_A mixes)."""
  cache = {'index': jnp.zeros((), jnp.int32),
           'state': form.init(batch, length, heads, head_dim, head_dim, dtype)}
  if super_values:
    cache['values'] = jnp.zeros((batch, length, heads, head_dim), dtype)
  return cache


def decode_step(form: decoding.DecodeForm, cache: Dict[str, Any], q, k, v, *,
                rotate_scores: bool, align_at: Optional[Callable[..., Any]] = None):
  """One token `[batch, 1, heads, dim]` through the cache: (new cache, out `[batch, 1, heads, dv]`).

  Args:
    form: the mechanism's `decoding.DecodeForm`.
    cache: from `init_cache`.
    rotate_scores: rotary positions on q and k (keys are cached rotated).
    align_at: the super projection's `align(values, index=i)`; None otherwise.
  """
  i = cache['index']
  cache = dict(cache)
  if align_at is not None:
    values = cache['values']
    checks.runtime_check(i < values.shape[1], 'decoding step at position {} is past the '
                         'super projection\'s context of {} tokens', i, values.shape[1])
    values = lax.dynamic_update_slice_in_dim(values, v.astype(values.dtype), i, axis=1)
    cache['values'] = values
    v = align_at(values, index=i)
  if rotate_scores:
    q, k = rotary.rotate(q, i), rotary.rotate(k, i)
  cache['state'], x = form.step(cache['state'], q, k, v, i)
  cache['index'] = i + 1
  return cache, x

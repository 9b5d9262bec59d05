"""What a multi-head attention layer checks of its call, whichever Flax API holds it: the
inputs resolved by flax's rules, batch axes flattened to one, the mask a mechanism can
honour, dropout and sown weights it can serve, and what a decoding call needs.

Each refusal is one line naming the value and the valid ones; the Linen and NNX layers
(`efficient_attn.layers.linen`, `.nnx`) and `make_attention_fn` call these.
"""

from typing import Any, Callable, Optional
import warnings

import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops import segments
from efficient_attn.ops import traced_checks


def resolve_inputs(inputs_q, inputs_k=None, inputs_v=None, inputs_kv=None):
  """(inputs_q, inputs_k, inputs_v) by flax's rules: k defaults to q and v to k.

  Raises ValueError for values without keys, for `inputs_kv` together with
  `inputs_k` / `inputs_v`, and for a boolean `inputs_v` (a mask passed
  positionally, flax's old call signature). `inputs_kv` warns as in flax, and
  so does an `inputs_v` whose last two axes are equal (it may be a float mask;
  then the value projection's shape check stops it, as in flax).
  """
  if inputs_kv is not None:
    if inputs_k is not None or inputs_v is not None:
      raise ValueError(
        'If either `inputs_k` or `inputs_v` is not None, `inputs_kv` must be '
        'None; pass inputs_k (and inputs_v) only'
      )
    warnings.warn(
      'The inputs_kv arg will be deprecated soon. Use inputs_k and inputs_v instead.',
      DeprecationWarning,
      stacklevel=3,
    )
    inputs_k = inputs_v = inputs_kv
  if inputs_k is None and inputs_v is not None:
    raise ValueError(
      '`inputs_k` cannot be None if `inputs_v` is not None; to use one array '
      'for both, pass it as inputs_k and leave inputs_v None'
    )
  shape = jnp.shape(inputs_v) if inputs_v is not None else ()
  is_bool = inputs_v is not None and jnp.asarray(inputs_v).dtype == jnp.bool_
  if is_bool or (len(shape) >= 2 and shape[-1] == shape[-2]):
    warnings.warn(
      f'You are passing an array of shape {shape} to the `inputs_v` arg, when you '
      f'may have intended to pass it to the `mask` arg: the function signature of '
      f"MultiHeadDotProductAttention's `__call__` method has changed to "
      f'`__call__(inputs_q, inputs_k=None, inputs_v=None, *, mask=None, ...)`',
      DeprecationWarning,
      stacklevel=3,
    )
  if is_bool:
    raise ValueError(
      f'inputs_v is a boolean array of shape {shape}: is it a mask '
      f'passed positionally? Pass it as mask=...'
    )
  inputs_k = inputs_q if inputs_k is None else inputs_k
  inputs_v = inputs_k if inputs_v is None else inputs_v
  return inputs_q, inputs_k, inputs_v


def check_dropout(decl: registry.Mechanism, rate: float) -> None:
  """Refuses attention-weight dropout for a mechanism that never forms the weights."""
  if rate > 0.0 and not decl.forms_weights:
    with_weights = registry.names_where(lambda m: m.forms_weights)
    raise ValueError(
      f'dropout_rate={rate}: attention-weight dropout needs a mechanism that forms '
      f'attention weights ({", ".join(with_weights)}), not {decl.name!r}; set the '
      f'attention dropout rate to 0'
    )


def check_weights_args(
  decl: registry.Mechanism, *, sow_weights: bool = False, force_fp32_for_softmax: bool = False
) -> None:
  """Refuses sow_weights / force_fp32_for_softmax for a mechanism that never forms the
  attention weights (it has no weights to sow, and no softmax to compute in float32)."""
  for arg, on in (('sow_weights', sow_weights), ('force_fp32_for_softmax', force_fp32_for_softmax)):
    if on and not decl.forms_weights:
      raise ValueError(
        f'{arg}=True: mechanism {decl.name!r} never forms the attention '
        f'weights; mechanisms that do: '
        f'{", ".join(registry.names_where(lambda m: m.forms_weights))}'
      )


def check_decode(
  mask, inputs_q, inputs_k, inputs_v, stepping: bool, sow_weights: bool = False
) -> None:
  """What a decoding call needs: no mask, no sown weights, self-attention.

  A call (a step of one token, or a prefill of several) attends to the cached positions
  up to each token's own (flax's rule), so it is causal whether or not the layer was
  built with causal=True; the call that creates the cache is the layer's ordinary
  forward. Padding in a decoding call is segment id 0.
  """
  if stepping and mask is not None:
    raise ValueError(
      'a decoding step takes no mask (it attends to the cached tokens up to its own '
      'position); mark padding tokens with segment_ids=0'
    )
  if stepping and sow_weights:
    raise ValueError(
      'sow_weights=True in a decoding step is not supported; sow the weights of a parallel forward'
    )
  if not (inputs_q is inputs_k is inputs_v):
    raise ValueError('decode=True supports self-attention only')


def is_key_padding(mask) -> bool:
  """`mask` is key padding by its shape: `[batch, kv_length]` or `[batch, 1, 1, kv_length]`."""
  return jnp.ndim(mask) == 2 or (jnp.ndim(mask) == 4 and mask.shape[1] == mask.shape[2] == 1)


def check_segments(
  decl: registry.Mechanism,
  segment_ids,
  *,
  mask=None,
  cross: bool = False,
  projection: Optional[str] = None,
) -> None:
  """Refuses, in one line naming the value and the valid ones, a call with `segment_ids`
  (packed rows) that the layer cannot run: a mechanism that does not declare `segments`
  (its `no_segments` says why), cross-attention, a mask other than key padding, and the
  super projection (its W_A mixes values across the whole row). Nothing for None."""
  if segment_ids is None:
    return
  if not decl.segments:
    able = registry.names_where(lambda m: m.segments)
    raise ValueError(
      f'segment_ids (packed rows): mechanism {decl.name!r} cannot keep packed documents '
      f'apart: {decl.no_segments}; mechanisms that can: {", ".join(able) or "none yet"}'
    )
  if cross:
    raise ValueError(
      'segment_ids with cross-attention (inputs_k or inputs_v other than inputs_q, or '
      'another length): a packed row is its own queries and keys; valid: self-attention '
      '(inputs_k=None, inputs_v=None)'
    )
  if mask is not None and not is_key_padding(mask):
    raise ValueError(
      f'segment_ids with a mask of shape {tuple(jnp.shape(mask))}: beside segment ids a '
      f'mask may only be key padding ([batch, kv_length] or [batch, 1, 1, kv_length]); '
      f'the documents and causal=True make the rest'
    )
  if projection == 'super':
    raise ValueError(
      "segment_ids with projection 'super': its W_A mixes values along the whole row, "
      "across documents; valid projections: 'standard', 'optimised', 'efficient'"
    )


def check_packed(
  decl: registry.Mechanism,
  segment_ids,
  positions,
  *,
  mask,
  inputs_q,
  inputs_k,
  inputs_v,
  projection: str,
  name: str = 'MultiHeadAttention',
):
  """What a layer's call checks of its packed rows before it projects (`check_segments`,
  the shapes and dtypes): (segment_ids, positions), each int32 `[batch, length]` or None."""
  check_segments(
    decl,
    segment_ids,
    mask=mask,
    cross=not (inputs_q is inputs_k is inputs_v),
    projection=projection,
  )
  batch, length = inputs_q.shape[:2]
  if segment_ids is not None:
    segment_ids = segments.check(segment_ids, batch, length, name)
  if positions is not None:
    positions = check_positions(positions, batch, length, name)
  return segment_ids, positions


def check_positions(positions, batch: int, length: int, name: str):
  """`positions` as an int32 `[batch, length]` array, else a one-line ValueError naming
  `name` and the shape or dtype it got."""
  positions = jnp.asarray(positions)
  if positions.shape != (batch, length) or not jnp.issubdtype(positions.dtype, jnp.integer):
    raise ValueError(
      f'{name}: positions of shape {tuple(positions.shape)} and dtype {positions.dtype} do '
      f'not fit the inputs; valid: integers [batch, length] = {[batch, length]}'
    )
  return positions.astype(jnp.int32)


def check_mask(decl: registry.Mechanism, mask, q_length: int) -> None:
  """Refuses a mask a key-padding-only mechanism cannot honour: one that differs
  across queries other than by padding (a causal mask) or across heads.

  A 4-D mask `[b, h, q, k]` is key padding when it is the outer product of a
  query and a key validity (`make_attention_mask(q_valid, k_valid)`), the same
  for every head. One whose head and query axes are both 1 (flax's
  `[b, 1, 1, k]`) is key padding by its shape; any other is checked: a concrete
  one at once, a traced one when it runs (`traced_checks.runtime_check`).
  """
  del q_length  # a single query's [b, h, 1, k] mask may still differ across heads
  if (
    decl.masks != 'key_padding'
    or mask is None
    or jnp.ndim(mask) != 4
    or (mask.shape[1] == 1 and mask.shape[2] == 1)
  ):
    return
  mask = jnp.asarray(mask, bool)
  keys = jnp.any(mask, axis=(1, 2), keepdims=True)
  queries = jnp.any(mask, axis=(1, 3), keepdims=True)
  ok = jnp.all(mask == (keys & queries))
  with_any = ', '.join(registry.names_where(lambda m: m.masks == 'any'))
  traced_checks.runtime_check(
    ok,
    f'mechanism {decl.name!r} honours only key-padding masks, and this '
    f'[batch, heads, q_length, kv_length] mask is not one: it differs across queries '
    f'(a causal mask from nn.make_causal_mask?) or across heads. Ask for causality with '
    f'causal=True and pass padding as a [batch, kv_length] mask or '
    f'make_attention_mask(valid, valid); for other masks use a mechanism that honours '
    f'any mask ({with_any})',
  )


def with_one_batch_axis(
  call: Callable[..., Any], inputs_q, inputs_k, inputs_v, mask, *rows, names=()
):
  """Runs `call(q, k, v, mask, *rows)` on inputs with 0 or several batch axes, flattened
  to one.

  Flax's convention: every axis before `[length, features]` is a batch axis.
  The mask is `[..., heads, q_length, kv_length]` or key padding `[..., kv_length]`;
  each of `rows` (named by `names`, for the errors) is None or `[..., length]`, e.g. the
  segment ids and positions. A decoding cache is kept for the flattened batch.
  """
  if inputs_q.ndim < 2:
    raise ValueError(f'inputs must be [..., length, features], got shape {inputs_q.shape}')
  batch_shape = inputs_q.shape[:-2]
  for name, row in zip(names, rows):
    if row is not None and jnp.shape(row)[:-1] != batch_shape:
      raise ValueError(
        f'{name} of shape {tuple(jnp.shape(row))} does not fit inputs of shape '
        f'{inputs_q.shape}; valid: [..., length] with the inputs\' batch axes {batch_shape}'
      )
  if len(batch_shape) == 1:
    return call(inputs_q, inputs_k, inputs_v, mask, *rows)
  flat = lambda x: x.reshape((-1,) + x.shape[-2:])
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.ndim == len(batch_shape) + 3:  # [..., heads, q, k]
      mask = jnp.broadcast_to(mask, batch_shape + mask.shape[-3:])
      mask = mask.reshape((-1,) + mask.shape[-3:])
    elif mask.ndim == len(batch_shape) + 1:  # [..., k] key padding
      mask = jnp.broadcast_to(mask, batch_shape + mask.shape[-1:]).reshape((-1, mask.shape[-1]))
    else:
      raise ValueError(
        f'mask of shape {mask.shape} does not fit inputs of shape '
        f'{inputs_q.shape}; valid: [..., heads, q_length, kv_length] or '
        f'[..., kv_length] with the inputs\' batch axes {batch_shape}'
      )
  rows = tuple(None if row is None else jnp.reshape(row, (-1, jnp.shape(row)[-1])) for row in rows)
  q = flat(inputs_q)  # self-attention stays recognisable: the same array for q, k and v
  k = q if inputs_k is inputs_q else flat(inputs_k)
  v = k if inputs_v is inputs_k else q if inputs_v is inputs_q else flat(inputs_v)
  out = call(q, k, v, mask, *rows)
  return out.reshape(batch_shape + out.shape[-2:])

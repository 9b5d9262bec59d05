"""What a multi-head attention layer does, whichever Flax API holds its parameters.

`efficient_attn.layers.linen` (Linen) and `efficient_attn.nnx` (NNX) own parameters
and caches each in their own way, and call these functions for everything
else: the input checks and their one-line errors, the mechanism call (dtype,
rotary positions, masks) and the decoding step. So the two layers cannot drift
apart, and a mechanism is never written twice.
"""

import copy
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple
import warnings

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.layers import decoding
from efficient_attn.layers import parallel
from efficient_attn.ops import masking
from efficient_attn.ops import rotary
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


def head_dim(num_heads: int, qkv_features: int) -> int:
  """qkv_features // num_heads, or ValueError when the heads do not divide the width."""
  if num_heads < 1 or qkv_features % num_heads:
    raise ValueError(
      f'num_heads={num_heads} must divide the attention width '
      f'{qkv_features} (qkv_features / d_model)'
    )
  return qkv_features // num_heads


def check_dropout(decl: registry.Mechanism, rate: float) -> None:
  """Refuses attention-weight dropout for a mechanism that never forms the weights."""
  if rate > 0.0 and not decl.forms_weights:
    with_weights = registry.names_where(lambda m: m.forms_weights)
    raise ValueError(
      f'dropout_rate={rate}: attention-weight dropout needs a mechanism that forms '
      f'attention weights ({", ".join(with_weights)}), not {decl.name!r}; set the '
      f'attention dropout rate to 0'
    )


def kv_heads(
  decl: registry.Mechanism, projection: str, num_heads: int, num_kv_heads: Optional[int]
) -> int:
  """Key/value heads of grouped-query attention (Ainslie et al. 2023), checked.

  None means num_heads (multi-head attention). Fewer heads need a divisor of
  num_heads, the 'standard' projection (the only scheme that projects keys and
  values into heads) and a mechanism whose keys are not its queries.
  """
  if num_kv_heads is None or num_kv_heads == num_heads:
    return num_heads
  if num_kv_heads < 1 or num_heads % num_kv_heads:
    raise ValueError(
      f'num_heads ({num_heads}) must be divisible by num_kv_heads '
      f'({num_kv_heads}); valid: a divisor of {num_heads}'
    )
  if projection != 'standard':
    raise ValueError(
      f'num_kv_heads={num_kv_heads}: grouped-query attention needs '
      f"projection 'standard' (the only scheme with key and value projections "
      f'into heads), not {projection!r}'
    )
  if decl.shared_qk:
    raise ValueError(
      f'num_kv_heads={num_kv_heads}: mechanism {decl.name!r} uses the queries '
      f'as keys, so keys cannot have fewer heads'
    )
  return num_kv_heads


class HeadLayout(NamedTuple):
  """The per-head shapes of one layer: `heads` heads of `head_dim` (qkv_features / heads),
  `kv_heads` key/value heads (grouped-query attention), and the mechanism's declared
  `qk_heads` x `qk_dim` queries and keys and `v_dim` values (`Mechanism.head_shapes`)."""

  heads: int
  head_dim: int
  kv_heads: int
  qk_heads: int
  qk_dim: int
  v_dim: int

  def features(self, name: str) -> Tuple[int, int]:
    """The `(heads, dim)` that the projection `name` ('query', 'key', 'value') maps to."""
    if name == 'query':
      return self.qk_heads, self.qk_dim
    if name == 'key':
      return (self.kv_heads if self.qk_heads == self.heads else self.qk_heads), self.qk_dim
    return self.kv_heads, self.v_dim


def _shape_options(
  decl: registry.Mechanism, options: registry.Options, heads: int, head_dim: int
) -> str:
  """'mechanism 'x' with a=1, b=2': the options that set its head shapes (those whose
  default gives other shapes)."""
  shapes = decl.head_shapes(options, heads=heads, head_dim=head_dim)
  named = [
    f'{opt.name}={options[opt.name]!r}'
    for opt in decl.options
    if options[opt.name] != opt.default
    and decl.head_shapes(
      registry.Options({**options, opt.name: opt.default}), heads=heads, head_dim=head_dim
    )
    != shapes
  ]
  return f'mechanism {decl.name!r}' + (f' with {", ".join(named)}' if named else '')


def head_layout(
  decl: registry.Mechanism,
  options: registry.Options,
  *,
  projection: str,
  heads: int,
  head_dim: int,
  kv_heads: int,
) -> HeadLayout:
  """The layer's `HeadLayout`: the mechanism's `head_shapes`, checked against the
  projection scheme and grouped-query attention (`kv_heads`, from `kv_heads`).

  Raises a one-line ValueError naming the options, the scheme and the valid ones:
  query/key groups that do not divide `heads`; queries and keys other than `heads` x
  `head_dim` without a key projection ('efficient' and 'super' slice the keys into
  heads); values other than `head_dim` wide without a value projection (only
  'standard' has one); shared query/key groups together with fewer key/value heads.
  """
  qk_heads, qk_dim, v_dim = decl.head_shapes(options, heads=heads, head_dim=head_dim)
  layout = HeadLayout(heads, head_dim, kv_heads, qk_heads, qk_dim, v_dim)
  if (qk_heads, qk_dim, v_dim) == (heads, head_dim, head_dim):
    return layout
  which = _shape_options(decl, options, heads, head_dim)
  if qk_heads < 1 or heads % qk_heads:
    divisors = ', '.join(str(i) for i in range(1, heads + 1) if heads % i == 0)
    raise ValueError(
      f'{which}: {qk_heads} query/key groups do not divide num_heads={heads}; valid: {divisors}'
    )
  with_keys = ('standard', 'optimised')
  if (qk_heads, qk_dim) != (heads, head_dim) and projection not in with_keys:
    raise ValueError(
      f'{which} projects queries and keys to (qk_heads, qk_dim) = '
      f'{(qk_heads, qk_dim)}, not (num_heads, head_dim) = {(heads, head_dim)}, '
      f'which needs a key projection: projection {projection!r} slices keys '
      f'into heads; valid: {", ".join(map(repr, with_keys))}'
    )
  if v_dim != head_dim and projection != 'standard':
    raise ValueError(
      f'{which} has values of {v_dim} per head (not head_dim={head_dim}), '
      f'which needs a value projection: projection {projection!r} slices '
      f"values into heads; valid: 'standard'"
    )
  if qk_heads != heads and kv_heads != heads:
    raise ValueError(
      f'{which} shares {qk_heads} query/key group(s) among {heads} heads, '
      f'which grouped-query attention (num_kv_heads={kv_heads}) cannot '
      f'combine with; valid: num_kv_heads=None (or {heads})'
    )
  return layout


def repeat_kv(q, k, v):
  """k, v `[batch, length, kv_heads, d]` repeated to q's heads (grouped-query attention:
  query head i reads key/value head i // (heads / kv_heads)). q and k with the same
  heads pass unchanged (groups of queries and keys shared by v's heads)."""
  h, hk = q.shape[-2], k.shape[-2]
  if hk == h:
    return k, v
  if h % hk or v.shape[-2] != hk:
    raise ValueError(
      f'queries have {h} heads, keys {hk} and values {v.shape[-2]}: key and '
      f'value heads must be equal and divide the query heads'
    )
  return jnp.repeat(k, h // hk, axis=-2), jnp.repeat(v, h // hk, axis=-2)


def state_heads(
  decl: registry.Mechanism, options: registry.Options, heads: int, kv_heads: int
) -> int:
  """Heads of the decoding state: kv_heads for a key/value cache or a state that depends
  on keys and values alone (`grouped_state`), else one per query head."""
  return kv_heads if decl.decode == 'kv_cache' or decl.grouped_state(options) else heads


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


def attention_weights(
  decl: registry.Mechanism,
  options: registry.Options,
  params,
  q,
  k,
  *,
  mask,
  causal: bool,
  ctx: registry.Context,
  dtype: Any,
):
  """The attention weights `[batch, heads, q_length, kv_length]` (as flax sows them).

  Every mechanism is linear in the values, out = A v, so attending to the
  identity (v = I, one value per key) returns A itself, whatever form the
  mechanism computes it in. Computed without dropout, in float32, then cast
  to `dtype`.
  """
  b, n = k.shape[0], k.shape[1]
  eye = jnp.broadcast_to(jnp.eye(n, dtype=jnp.float32)[None, :, None, :], (b, n, k.shape[2], n))
  k, eye = repeat_kv(q, k, eye)
  quiet = copy.copy(ctx)
  quiet.deterministic = True
  quiet.forming_weights = True
  w = decl.attend(options, params, q, k, eye, mask=mask, causal=causal, ctx=quiet)
  return jnp.swapaxes(w, 1, 2).astype(dtype)


def check_decode(
  mask, inputs_q, inputs_k, inputs_v, stepping: bool, sow_weights: bool = False
) -> None:
  """What a decoding step needs: no mask, no sown weights, self-attention, one token
  per step.

  A step attends to the cached positions up to its own (flax's rule), so the
  steps are causal whether or not the layer was built with causal=True; the
  call that creates the cache is the layer's ordinary forward.
  """
  if stepping and mask is not None:
    raise ValueError(
      'a decoding step takes no mask (it attends to the cached tokens up to its own position)'
    )
  if stepping and sow_weights:
    raise ValueError(
      'sow_weights=True in a decoding step is not supported; sow the weights of a parallel forward'
    )
  if not (inputs_q is inputs_k is inputs_v):
    raise ValueError('decode=True supports self-attention only')
  if stepping and inputs_q.shape[1] != 1:
    raise ValueError(
      f'a decoding step takes one token [batch, 1, features], got '
      f'shape {inputs_q.shape} (the cache already exists)'
    )


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


def with_one_batch_axis(call: Callable[..., Any], inputs_q, inputs_k, inputs_v, mask):
  """Runs `call(q, k, v, mask)` on inputs with 0 or several batch axes, flattened to one.

  Flax's convention: every axis before `[length, features]` is a batch axis.
  The mask is `[..., heads, q_length, kv_length]` or key padding `[..., kv_length]`.
  A decoding cache is kept for the flattened batch.
  """
  if inputs_q.ndim < 2:
    raise ValueError(f'inputs must be [..., length, features], got shape {inputs_q.shape}')
  batch_shape = inputs_q.shape[:-2]
  if len(batch_shape) == 1:
    return call(inputs_q, inputs_k, inputs_v, mask)
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
  q = flat(inputs_q)  # self-attention stays recognisable: the same array for q, k and v
  k = q if inputs_k is inputs_q else flat(inputs_k)
  v = k if inputs_v is inputs_k else q if inputs_v is inputs_q else flat(inputs_v)
  out = call(q, k, v, mask)
  return out.reshape(batch_shape + out.shape[-2:])


def check_inputs(
  decl: registry.Mechanism,
  q,
  k,
  v,
  mask,
  *,
  stepping: bool = False,
  options: Optional[registry.Options] = None,
  head_dim: Optional[int] = None,
) -> Tuple[int, int]:
  """One-line errors for inconsistent q, k, v and mask shapes (see `masking.check_inputs`);
  k and v may have fewer heads than q, a divisor (grouped-query attention).

  With the `options`, q, k and v must also have the shapes the mechanism declares
  (`Mechanism.head_shapes`) for the layer's `head_dim` (None: q's) where those differ
  from the default, e.g. q and k with fewer heads than v (shared groups).

  Returns (heads, head_dim): the layer's heads (q's, or v's where q and k are shared
  groups) and head_dim.
  """
  if not q.ndim == k.ndim == v.ndim == 4:
    masking.check_inputs(q, k, v, mask, name=f'mechanism {decl.name!r}')  # raises
  heads, head_dim = max(q.shape[2], v.shape[2]), head_dim or q.shape[3]
  grouped = False
  if options is not None:
    qk_heads, qk_dim, v_dim = decl.head_shapes(options, heads=heads, head_dim=head_dim)
    grouped = qk_heads < heads
    # Grouped-query attention (heads per query/key, not shared groups): k and v may have
    # fewer heads, the same divisor of heads for both.
    kv = (
      k.shape[2]
      if (not grouped and k.shape[2] == v.shape[2] and k.shape[2] and heads % k.shape[2] == 0)
      else None
    )
    if (qk_heads, qk_dim, v_dim) != (heads, head_dim, head_dim) and (
      q.shape[2:] != (qk_heads, qk_dim)
      or k.shape[2:] not in ((qk_heads, qk_dim), (kv, qk_dim))
      or v.shape[2:] not in ((heads, v_dim), (kv, v_dim))
    ):
      raise ValueError(
        f'{_shape_options(decl, options, heads, head_dim)} takes q and k [batch, length, '
        f'{qk_heads}, {qk_dim}] and v [batch, length, {heads}, {v_dim}] for {heads} heads '
        f'of head_dim={head_dim}, got q {tuple(q.shape)}, k {tuple(k.shape)}, '
        f'v {tuple(v.shape)} (a layer whose head_dim is not q\'s passes head_dim)'
      )
  if k.shape[2] == v.shape[2] and k.shape[2] and q.shape[2] % k.shape[2] == 0:
    k, v = (jax.ShapeDtypeStruct(x.shape[:2] + q.shape[2:3] + x.shape[3:], x.dtype) for x in (k, v))
  masking.check_inputs(
    q,
    k,
    v,
    mask,
    name=f'mechanism {decl.name!r}',
    same_length=decl.self_attention_only and not stepping,
    qk_groups=grouped,
  )
  return heads, head_dim


def declared_params(
  decl: registry.Mechanism,
  options: registry.Options,
  *,
  heads: int,
  head_dim: int,
  max_length: Optional[int],
  causal: bool,
  features: Optional[int],
) -> Dict[str, registry.ParamSpec]:
  """The parameters a layer creates for the mechanism: `params`, and `input_params` of a
  mechanism that reads the layer input of `features` features (then not None)."""
  specs = dict(
    decl.params(options, heads=heads, head_dim=head_dim, max_length=max_length, causal=causal)
  )
  if decl.reads_input:
    if features is None:
      raise input_needed(decl)
    specs.update(decl.input_params(options, features=features, heads=heads, head_dim=head_dim))
  return specs


def input_needed(decl: registry.Mechanism) -> ValueError:
  return ValueError(
    f'mechanism {decl.name!r} reads the layer input (its gates are functions '
    f'of each token): pass inputs=[batch, q_length, features] (the attention '
    f'layers do)'
  )


def run_mechanism(
  decl: registry.Mechanism,
  options: registry.Options,
  params: Dict[str, Any],
  q,
  k,
  v,
  *,
  mask,
  causal: bool,
  ctx: registry.Context,
  use_rotary: bool,
  dtype: Any = None,
  state=None,
  position=None,
  sow_weights: bool = False,
  force_fp32_for_softmax: bool = False,
  inputs=None,
  head_dim: Optional[int] = None,
  sequence_axis: Optional[str] = None,
):
  """The declared mechanism on projected heads: `attend`, or one decoding `step`.

  q `[batch, q_length, heads, head_dim]`, k `[batch, kv_length, kv_heads,
  head_dim]`, v `[batch, kv_length, kv_heads, v_dim]` -> `[batch, q_length,
  heads, v_dim]`; kv_heads divides heads (grouped-query attention). A mechanism
  that declares other head shapes (`Mechanism.head_shapes`) takes exactly those
  (q and k `[..., qk_heads, qk_dim]`, v `[..., heads, v_dim]`); `head_dim` is then
  the layer's (qkv_features / heads; None: q's). With `state`, one token and
  `(new_state, out_t)`. `params` are the declared ones (and any shared ones),
  however the wrapper stores them.

  sow_weights: return `(out, weights)`, weights `[batch, heads, q_length,
  kv_length]` (see `attention_weights`). force_fp32_for_softmax: the weights
  multiply float32 values (and are sown in float32) whatever `dtype` is; scores
  and softmax are float32 in every mechanism anyway. inputs: the layer's query
  input `[batch, q_length, features]` (one token in a step), which a `reads_input`
  mechanism's gates read (`ctx.gates`).

  sequence_axis: a mesh axis of the ambient mesh (`jax.set_mesh`) to split the
  sequence over (context parallelism, `efficient_attn.layers.parallel`): the mechanism's
  `attend_sharded` runs in `jax.shard_map`, on one block of the sequence per device.
  `parallel.check` refuses what it cannot split, in one line. A decoding step (one
  token) is not split.
  """
  check_weights_args(decl, sow_weights=sow_weights, force_fp32_for_softmax=force_fp32_for_softmax)
  check_inputs(decl, q, k, v, mask, stepping=state is not None, options=options, head_dim=head_dim)
  if sequence_axis is not None and state is None:
    parallel.check(
      decl,
      axis=sequence_axis,
      mesh=jax.sharding.get_abstract_mesh(),
      q_length=q.shape[1],
      kv_length=k.shape[1],
      mask=mask,
      sow_weights=sow_weights,
      dropout_rate=ctx.dropout_rate,
      deterministic=ctx.deterministic,
    )
  if state is None or not decl.grouped_state(options):
    k, v = repeat_kv(q, k, v)
  if decl.reads_input:
    if inputs is None:
      raise input_needed(decl)
    if inputs.ndim != 3 or inputs.shape[:2] != q.shape[:2]:
      raise ValueError(
        f'mechanism {decl.name!r}: inputs of shape {inputs.shape} do not fit '
        f'queries {q.shape}; valid: [batch, q_length, features] = '
        f'{q.shape[:2] + (-1,)}'
      )
    ctx.gates = decl.gates(options, params, inputs)
  dtype = dtype or q.dtype
  q, k, v = (x.astype(dtype) for x in (q, k, v))
  if force_fp32_for_softmax:
    v = v.astype(jnp.promote_types(v.dtype, jnp.float32))
  if use_rotary:
    positions = (
      rotary.positions_of(q.shape[1], k.shape[1]) if state is None else rotary.at(position)
    )
    if decl.rotary == 'scores':
      q, k = rotary.rotate(q, positions[0]), rotary.rotate(k, positions[1])
    else:
      ctx.positions, ctx.position = positions, position
  if state is not None:  # a decoding step (the layer refuses sow_weights there)
    return decl.step(options, params, state, q, k, v, ctx=ctx)
  check_mask(decl, mask, q.shape[1])
  if sequence_axis is not None:
    return parallel.attend(
      decl, options, params, q, k, v, mask=mask, causal=causal, ctx=ctx, axis=sequence_axis
    )
  out = decl.attend(options, params, q, k, v, mask=mask, causal=causal, ctx=ctx)
  if not sow_weights:
    return out
  weights_dtype = jnp.float32 if force_fp32_for_softmax else dtype
  return out, attention_weights(
    decl, options, params, q, k, mask=mask, causal=causal, ctx=ctx, dtype=weights_dtype
  )


# The decoding cache, under flax's names where flax has the same thing.
CACHE_NAMES = ('cache_index', 'cached_key', 'cached_value', 'cached_state', 'cached_raw_values')


def init_cache(
  form: decoding.DecodeForm,
  *,
  batch: int,
  length: int,
  heads: int,
  head_dim: int,
  dtype: Any,
  super_values: bool,
  v_dim: Optional[int] = None,
) -> Dict[str, Any]:
  """An empty decoding cache for `length` tokens of `heads` (`state_heads`) heads, keys of
  `head_dim` and values of `v_dim` (None: head_dim) features (`HeadLayout`'s qk_dim, v_dim).

  'cache_index' (the next position); the mechanism's state: 'cached_key' and
  'cached_value' `[batch, slots, heads, head_dim]` for a key/value cache (as
  flax; slots = length, or min(length, window) for a sliding window's ring buffer,
  `decoding.window_kv_cache`), 'cached_state' for a recurrent state; and, for the super projection,
  'cached_raw_values' (the raw values its lower-triangular W_A mixes).
  """
  v_dim = v_dim or head_dim
  cache = {'cache_index': jnp.zeros((), jnp.int32)}
  state = form.init(batch, length, heads, head_dim, v_dim, dtype)
  if isinstance(state, decoding.KVCache):
    cache['cached_key'], cache['cached_value'] = state
  else:
    cache['cached_state'] = state
  if super_values:
    cache['cached_raw_values'] = jnp.zeros((batch, length, heads, v_dim), dtype)
  return cache


def decode_step(
  form: decoding.DecodeForm,
  cache: Dict[str, Any],
  q,
  k,
  v,
  *,
  rotate_scores: bool,
  align_at: Optional[Callable[..., Any]] = None,
):
  """One token `[batch, 1, heads, dim]` through the cache: (new cache, out `[batch, 1, heads, dv]`).

  Raises ValueError when `batch` is not the cache's.

  Args:
    form: the mechanism's `decoding.DecodeForm`.
    cache: from `init_cache`.
    rotate_scores: rotary positions on q and k (keys are cached rotated).
    align_at: the super projection's `align(values, index=i)`; None otherwise.
  """
  cached = [
    x for name, value in cache.items() if name != 'cache_index' for x in jax.tree.leaves(value)
  ]  # every one [batch, ...]
  if cached and q.shape[0] != cached[0].shape[0]:
    raise ValueError(
      f'a decoding step of batch {q.shape[0]} does not fit the cache, made '
      f'for batch {cached[0].shape[0]} (batch axes flattened); decode with '
      f'the batch the cache was created with'
    )
  i = cache['cache_index']
  cache = dict(cache)
  if align_at is not None:
    values = cache['cached_raw_values']
    traced_checks.runtime_check(
      i < values.shape[1],
      'decoding step at position {} is past the super projection\'s context of {} tokens',
      i,
      values.shape[1],
    )
    values = lax.dynamic_update_slice_in_dim(values, v.astype(values.dtype), i, axis=1)
    cache['cached_raw_values'] = values
    v = align_at(values, index=i)
  if rotate_scores and 'cached_key' in cache:  # a recurrent step rotates in run_mechanism
    q, k = rotary.rotate(q, i), rotary.rotate(k, i)
  if 'cached_key' in cache:
    state, x = form.step(decoding.KVCache(cache['cached_key'], cache['cached_value']), q, k, v, i)
    cache['cached_key'], cache['cached_value'] = state
  else:
    cache['cached_state'], x = form.step(cache['cached_state'], q, k, v, i)
  cache['cache_index'] = i + 1
  return cache, x

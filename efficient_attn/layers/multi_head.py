"""The mechanism call of a multi-head attention layer, whichever Flax API holds its parameters.

`efficient_attn.layers.linen` (Linen) and `efficient_attn.nnx` (NNX) own parameters
and caches each in their own way, and call `run_mechanism` for the mechanism itself:
the declared parameters (`declared_params`), the checks of q, k, v
(`efficient_attn.layers.heads`), dtype, rotary positions, the mask, the sequence split
(`efficient_attn.layers.parallel`), a decoding step, and the attention weights
(`attention_weights`). So the two layers cannot drift apart, and a mechanism is never
written twice. Their input checks are `efficient_attn.layers.inputs`; their decoding
cache `efficient_attn.layers.cache`.
"""

import copy
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.layers import checks
from efficient_attn.layers import head_shapes
from efficient_attn.layers import non_finite
from efficient_attn.layers import parallel
from efficient_attn.ops import rotary
from efficient_attn.ops import segments


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
  k, eye = head_shapes.repeat_kv(q, k, eye)
  quiet = copy.copy(ctx)
  quiet.deterministic = True
  quiet.forming_weights = True
  w = decl.attend(options, params, q, k, eye, mask=mask, causal=causal, ctx=quiet)
  return jnp.swapaxes(w, 1, 2).astype(dtype)


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
  segment_ids=None,
  positions=None,
):
  """The declared mechanism on projected heads: `attend`, or a decoding call (`step` for
  one token, `prefill` for more).

  q `[batch, q_length, heads, head_dim]`, k `[batch, kv_length, kv_heads,
  head_dim]`, v `[batch, kv_length, kv_heads, v_dim]` -> `[batch, q_length,
  heads, v_dim]`; kv_heads divides heads (grouped-query attention). A mechanism
  that declares other head shapes (`Mechanism.head_shapes`) takes exactly those
  (q and k `[..., qk_heads, qk_dim]`, v `[..., heads, v_dim]`); `head_dim` is then
  the layer's (qkv_features / heads; None: q's). With `state`, a decoding call of n
  tokens and `(new_state, out)`. `params` are the declared ones (and any shared ones),
  however the wrapper stores them.

  segment_ids: `[batch, length]` int, packed rows (0 is padding; docs/design.md,
  "Documents"), for a mechanism that declares `segments` (others refuse, in one line):
  the mechanism reads their document index (`ctx.documents`), the mask becomes the key
  padding `segment_ids != 0` (and the mask's, which may only be key padding) and rotary
  positions restart at each document. In a decoding call, the tokens' raw ids
  (`registry.Mechanism.step`). positions: `[batch, length]` int, the tokens' rotary
  positions (default: `ops.segments.positions` of the segment ids, else 0..length-1);
  in a decoding call `position` holds them.

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
  checks.check_weights_args(
    decl, sow_weights=sow_weights, force_fp32_for_softmax=force_fp32_for_softmax
  )
  head_shapes.check_inputs(
    decl, q, k, v, mask, stepping=state is not None, options=options, head_dim=head_dim
  )
  name = f'mechanism {decl.name!r}'
  if segment_ids is not None:
    checks.check_segments(decl, segment_ids, mask=mask, cross=q.shape[1] != k.shape[1])
    segment_ids = segments.check(segment_ids, q.shape[0], q.shape[1], name)
    if state is None:
      ctx.documents = segments.document_index(segment_ids)
      padding = parallel.key_padding_of(mask, *q.shape[:2])
      real = segments.is_real(segment_ids)
      mask = real if padding is None else real & padding
    else:
      ctx.documents = segment_ids
  if positions is not None and state is None:
    positions = checks.check_positions(positions, q.shape[0], q.shape[1], name)
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
    k, v = head_shapes.repeat_kv(q, k, v)
  if decl.reads_input:
    if inputs is None:
      raise input_needed(decl)
    if inputs.ndim != 3 or inputs.shape[:2] != q.shape[:2]:
      raise ValueError(
        f'mechanism {decl.name!r}: inputs of shape {inputs.shape} do not fit '
        f'queries {q.shape}; valid: [batch, q_length, features] = '
        f'{q.shape[:2] + (-1,)}'
      )
  poisoned = None
  if state is None and causal and q.shape[1] == k.shape[1]:
    q, k, v, inputs, poisoned = non_finite.guard_future(
      q, k, v, inputs if decl.reads_input else None, mask=mask, documents=ctx.documents
    )
  if decl.reads_input:
    ctx.gates = decl.gates(options, params, inputs)
  dtype = dtype or q.dtype
  q, k, v = (x.astype(dtype) for x in (q, k, v))
  if force_fp32_for_softmax:
    v = v.astype(jnp.promote_types(v.dtype, jnp.float32))
  if use_rotary:
    if state is not None:
      pairs = rotary.at(position)
    elif positions is not None:
      pairs = (positions, positions)
    elif segment_ids is not None:
      pairs = (segments.positions(segment_ids),) * 2
    else:
      pairs = rotary.positions_of(q.shape[1], k.shape[1])
    if decl.rotary == 'scores':
      q, k = rotary.rotate(q, pairs[0]), rotary.rotate(k, pairs[1])
    else:
      ctx.positions, ctx.position = pairs, position
  if state is not None:  # a decoding call (the layer refuses sow_weights there)
    if q.shape[1] == 1:
      return decl.step(options, params, state, q, k, v, ctx=ctx)
    return decl.prefill(options, params, state, q, k, v, ctx=ctx)
  checks.check_mask(decl, mask, q.shape[1])
  k, v = non_finite.zero_unused_keys(mask, k, v)
  if sequence_axis is not None:
    out = parallel.attend(
      decl, options, params, q, k, v, mask=mask, causal=causal, ctx=ctx, axis=sequence_axis
    )
  else:
    out = decl.attend(options, params, q, k, v, mask=mask, causal=causal, ctx=ctx)
  if poisoned is not None:
    out = non_finite.poison(out, poisoned)
  if not sow_weights:
    return out
  weights_dtype = jnp.float32 if force_fp32_for_softmax else dtype
  weights = attention_weights(
    decl, options, params, q, k, mask=mask, causal=causal, ctx=ctx, dtype=weights_dtype
  )
  return out, weights if poisoned is None else non_finite.poison(weights, poisoned, axis=2)

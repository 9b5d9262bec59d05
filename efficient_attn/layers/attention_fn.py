"""`make_attention_fn`: a parameter-free mechanism as the `attention_fn` of flax's own
attention layers (Linen's `MultiHeadDotProductAttention`, NNX's `MultiHeadAttention`)."""

from typing import Any, Callable, Union

import flax.linen as nn

from efficient_attn import registry
from efficient_attn.layers import multi_head


def make_attention_fn(
  mechanism: Union[str, registry.Mechanism] = 'softmax', **options
) -> Callable[..., Any]:
  """A parameter-free mechanism as the `attention_fn` of flax's own attention layers.

      layer = nn.MultiHeadDotProductAttention(
          num_heads=4, attention_fn=efficient_attn.make_attention_fn('linear'))
      layer = nnx.MultiHeadAttention(
          num_heads=4, in_features=64, attention_fn=efficient_attn.make_attention_fn('linear'),
          decode=False, rngs=nnx.Rngs(0))

  The returned function takes query `[batch, length, heads, head_dim]`, key and
  value `[batch, length, kv_heads, head_dim]` (kv_heads dividing heads: flax's
  grouped-query attention) and flax's mask; options are the mechanism's
  (checked here). `force_fp32_for_softmax` and `sow_weights` (flax passes the
  module) are honoured by mechanisms that form the weights, and `is_causal`
  where the mechanism has a causal form. What it cannot honour it refuses with
  one line rather than ignoring: attention dropout during training, an
  attention bias, and the options above for other mechanisms. A caller that packs
  documents into rows passes `segment_ids` `[batch, length]` (0 is padding) to the
  function itself (`functools.partial`, flax passes none), for a mechanism that
  declares `segments`.
  """
  decl = registry.declaration(mechanism)
  decl, resolved = registry.configure(decl, options, causal=decl.causal_only)
  mechanism = decl.name
  if not decl.parameter_free:
    free = registry.names_where(lambda m: m.parameter_free)
    raise ValueError(
      f'mechanism {mechanism!r} has parameters or random features and '
      f'cannot be an attention_fn; use efficient_attn.MultiHeadAttention, '
      f'or one of: {", ".join(free)}'
    )

  def refuse(what):
    raise ValueError(
      f'{what} is not supported by the attention_fn of mechanism '
      f'{mechanism!r}; use efficient_attn.MultiHeadAttention'
    )

  def attention_fn(
    query,
    key,
    value,
    bias=None,
    mask=None,
    dropout_rng=None,
    dropout_rate=0.0,
    broadcast_dropout=True,
    deterministic=True,
    dtype=None,
    precision=None,
    force_fp32_for_softmax=False,
    module=None,
    is_causal=False,
    segment_ids=None,
  ):
    del dropout_rng, broadcast_dropout, precision
    if bias is not None:
      refuse('an attention bias')
    if dropout_rate > 0.0 and not deterministic:
      refuse(f'attention dropout (dropout_rate={dropout_rate}) in training')
    if is_causal:
      registry.configure(decl, options, causal=True)  # refuses a non-causal mechanism
    heads, head_dim = query.shape[-2:]
    shapes = decl.head_shapes(resolved, heads=heads, head_dim=head_dim)
    if shapes != (heads, head_dim, head_dim):  # flax's projections make (heads, head_dim)
      refuse(
        f'head shapes (qk_heads, qk_dim, v_dim) = {shapes}, not (heads, head_dim, '
        f'head_dim) = {(heads, head_dim, head_dim)},'
      )
    if dtype is not None:
      query, key, value = (x.astype(dtype) for x in (query, key, value))
    out = multi_head.run_mechanism(
      decl,
      resolved,
      {},
      query,
      key,
      value,
      mask=mask,
      causal=bool(is_causal),
      ctx=registry.Context(),
      use_rotary=False,
      sow_weights=module is not None,
      force_fp32_for_softmax=force_fp32_for_softmax,
      segment_ids=segment_ids,
    )
    if module is None:
      return out
    out, weights = out
    if isinstance(module, nn.Module):
      module.sow('intermediates', 'attention_weights', weights)
    else:  # an NNX module
      from flax import nnx  # pylint: disable=g-import-not-at-top

      module.sow(nnx.Intermediate, 'attention_weights', weights)
    return out

  return attention_fn

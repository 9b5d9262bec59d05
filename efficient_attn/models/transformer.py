"""The pre-LayerNorm Transformer encoder shared by every model, and its settings object.

    config = TransformerConfig(d_model=128, depth=4, num_heads=4, mlp_dim=256,
                               mechanism='nystrom', projection='efficient')
    y = Encoder(config).apply(variables, x)      # x [batch, length, d_model]

One `TransformerConfig` (the flax examples/wmt style) flows from the model to
every block and attention layer, so no field list is repeated per module. It
and the blocks' pieces (`attention_layer`, `MlpBlock`) live in
`efficient_attn.models.blocks`, shared with the reversible blocks.
"""

from typing import Any, Mapping, Optional

import flax.linen as nn

from efficient_attn.layers import hybrid
from efficient_attn.models import reversible
from efficient_attn.models.blocks import MlpBlock
from efficient_attn.models.blocks import TransformerConfig
from efficient_attn.models.blocks import attention_layer


class EncoderBlock(nn.Module):
  """x + Attn(LN(x)), then + MLP(LN(x)). Tokens `[batch, length, d_model]`.

  Attributes:
    config: the stack's settings.
    shared_params: attention parameters shared by every block (see
      `registry.Mechanism.shared_params`), created by the `Encoder`.
  """

  config: TransformerConfig
  shared_params: Optional[Mapping[str, Any]] = None

  @nn.compact
  def __call__(self, x, mask=None, deterministic: bool = True, segment_ids=None, positions=None):
    c = self.config
    y = nn.LayerNorm(dtype=c.dtype, param_dtype=c.param_dtype)(x)
    y = attention_layer(c, self.shared_params)(
      y, mask=mask, deterministic=deterministic, segment_ids=segment_ids, positions=positions
    )
    y = nn.Dropout(c.dropout_rate)(y, deterministic=deterministic)
    x = x + y
    y = nn.LayerNorm(dtype=c.dtype, param_dtype=c.param_dtype)(x)
    y = MlpBlock(c, name='mlp')(y, deterministic=deterministic)
    return x + y


class Encoder(nn.Module):
  """`depth` EncoderBlocks and a final LayerNorm.

  The blocks take the mechanisms of a pattern ('linear+local') in turn (see
  `efficient_attn.layers.hybrid`). Parameters a mechanism shares across layers (e.g.
  Linformer's layerwise E = F) are created here once, under 'shared_attention_<name>'
  ('shared_attention_<mechanism>_<name>' in a pattern), and passed to its blocks.
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, x, mask=None, deterministic: bool = True, *, segment_ids=None, positions=None):
    """x `[batch, length, d_model]`; mask flax-style, key padding or None -> same shape.

    segment_ids `[batch, length]` int: packed rows (0 is padding), each token attending
    only to its own document, in every block (`efficient_attn.MultiHeadAttention`);
    positions `[batch, length]` int: the rotary positions (default: each token's position
    in its document). In a decoding call (`decode=True`), the tokens' ids and positions.
    """
    c = self.config
    # Resolved once for the whole stack (or handed down so: a `hybrid.Stack`): the blocks
    # get their declaration and options.
    layers = hybrid.stack(c.mechanism, c.options, causal=c.causal, max_length=c.max_length).layers
    distinct = dict(layers)  # {declaration: its options}, one entry per mechanism
    if len(layers) > 1:
      hybrid.check_depth(c.mechanism, c.depth)
    if c.reversible and len(distinct) > 1:
      raise ValueError(
        f'reversible=True with mechanism {hybrid.name(c.mechanism)!r}: the '
        f'reversible stack takes one mechanism; valid: reversible=False'
      )
    head_dim = x.shape[-1] // c.num_heads
    shared = {}  # per mechanism: its shared parameters (one mechanism: named as ever)
    for decl, options in distinct.items():
      prefix = 'shared_attention_' + (f'{decl.name}_' if len(distinct) > 1 else '')
      specs = decl.shared_params(
        options, heads=c.num_heads, head_dim=head_dim, max_length=c.max_length
      )
      shared[decl.name] = {
        name: self.param(prefix + name, init, shape, c.param_dtype)
        for name, (shape, init) in specs.items()
      } or None
    if c.reversible:
      decl, options = layers[0]
      x = reversible.ReversibleStack(
        c.replace(mechanism=decl, options=options), shared[decl.name], name='reversible'
      )(x, mask, deterministic, segment_ids=segment_ids, positions=positions)
    else:
      for i in range(c.depth):
        decl, options = layers[i % len(layers)]
        x = EncoderBlock(
          c.replace(mechanism=decl, options=options), shared[decl.name], name=f'block_{i}'
        )(x, mask=mask, deterministic=deterministic, segment_ids=segment_ids, positions=positions)
    return nn.LayerNorm(dtype=c.dtype, param_dtype=c.param_dtype, name='final_norm')(x)

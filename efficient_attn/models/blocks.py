"""The settings of a Transformer stack and the pieces its blocks are made of.

`TransformerConfig` flows from the model to every block and attention layer;
`attention_layer` and `MlpBlock` are shared by the plain blocks
(`efficient_attn.models.transformer`) and the reversible ones
(`efficient_attn.models.reversible`), which both import this module.
"""

import dataclasses
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.layers import hybrid
from efficient_attn.layers.linen import MultiHeadAttention


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Settings of a Transformer stack and its attention layers.

  Attributes:
    d_model: token width.
    depth: number of blocks.
    num_heads, mlp_dim: attention heads and MLP hidden width.
    num_kv_heads: key/value heads (grouped-query attention; None: num_heads).
    mechanism, projection, options: the attention layer (see
      `efficient_attn.MultiHeadAttention`); mechanism is a name or its declaration, or
      a pattern the blocks take in turn ('linear+local', or a tuple of declarations;
      see `efficient_attn.layers.hybrid`), whose options are shared out by mechanism.
      The `Encoder` resolves the mechanism once (`hybrid.configure`) and hands its
      blocks the declaration and the resolved options; a `hybrid.Stack` (mechanisms
      configured once already, e.g. by a trainer's checks) it hands down as it is, its
      options with it (`options` is then not read).
    causal: autoregressive attention (a causal-only mechanism, e.g. 'gla', is causal
      whatever this says: `attention_causal`; in a pattern, that block only).
    max_length: the context length (the super projection and fixed-length
      mechanisms are built for it); models set it from their input size.
    dropout_rate: residual and MLP dropout; attention_dropout_rate: on the
      attention weights (mechanisms that form them).
    dtype, param_dtype: computation and parameter dtypes.
    decode: one token per call with a 'cache' (see `MultiHeadAttention`).
    rotary: rotary positions in every attention layer (see `MultiHeadAttention`).
    reversible: reversible residual blocks (`efficient_attn.models.reversible`):
      activation memory that does not grow with depth, for one more forward.
    sequence_axis: context parallelism in every attention layer: the axis of the
      ambient mesh to split the sequence over (see `MultiHeadAttention`); None: no split.
  """

  d_model: int = 64
  depth: int = 2
  num_heads: int = 4
  mlp_dim: int = 128
  num_kv_heads: Optional[int] = None
  mechanism: hybrid.Mechanisms = 'softmax'
  projection: str = 'standard'
  options: Optional[Mapping[str, Any]] = None
  causal: bool = False
  max_length: Optional[int] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Any = None
  param_dtype: Any = jnp.float32
  decode: bool = False
  rotary: bool = False
  reversible: bool = False
  sequence_axis: Optional[str] = None

  def replace(self, **changes) -> 'TransformerConfig':
    return dataclasses.replace(self, **changes)

  @property
  def attention_causal(self) -> bool:
    """causal, or a causal-only mechanism in some block (an encoder then reads left to
    right, as an RNN, there)."""
    return self.causal or any(d.causal_only for d in hybrid.declarations(self.mechanism))


def attention_layer(c: TransformerConfig, shared_params=None) -> MultiHeadAttention:
  """The attention layer of a block, named 'attention'."""
  if not isinstance(c.mechanism, (str, registry.Mechanism)):  # the encoder resolves patterns
    raise ValueError(f'a block takes one mechanism, got {c.mechanism!r}')
  return MultiHeadAttention(
    num_heads=c.num_heads,
    num_kv_heads=c.num_kv_heads,
    mechanism=c.mechanism,
    projection=c.projection,
    options=c.options,
    causal=c.attention_causal,
    max_length=c.max_length,
    dropout_rate=c.attention_dropout_rate,
    dtype=c.dtype,
    param_dtype=c.param_dtype,
    shared_params=shared_params,
    decode=c.decode,
    rotary=c.rotary,
    sequence_axis=c.sequence_axis,
    name='attention',
  )


class MlpBlock(nn.Module):
  """Dense(mlp_dim) -> GELU -> dropout -> Dense(d_model) -> dropout."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    c = self.config
    y = nn.Dense(c.mlp_dim, dtype=c.dtype, param_dtype=c.param_dtype)(x)
    y = nn.gelu(y)
    y = nn.Dropout(c.dropout_rate)(y, deterministic=deterministic)
    y = nn.Dense(x.shape[-1], dtype=c.dtype, param_dtype=c.param_dtype)(y)
    return nn.Dropout(c.dropout_rate)(y, deterministic=deterministic)

"""Pre-LayerNorm Transformer encoder shared by every model in the project."""
import dataclasses
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn.attention import MultiHeadAttention


class MlpBlock(nn.Module):
  """Dense(mlp_dim) -> GELU -> dropout -> Dense(d_model) -> dropout."""
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    d = x.shape[-1]
    y = nn.Dense(self.mlp_dim, dtype=self.dtype, param_dtype=self.param_dtype)(x)
    y = nn.gelu(y)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    y = nn.Dense(d, dtype=self.dtype, param_dtype=self.param_dtype)(y)
    return nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)


class EncoderBlock(nn.Module):
  """x + Attn(LN(x)), then + MLP(LN(x)). Tokens `[batch, length, d_model]`.

  Attributes:
    num_heads, mechanism, projection, options, causal, max_length: passed to
      `efficient_attn.MultiHeadAttention`.
    mlp_dim: hidden width of the MLP.
    dropout_rate: residual dropout; attention_dropout_rate: on attention weights.
    attention_cls: the attention layer class (LoRA swaps in an adapted one).
  """
  num_heads: int
  mlp_dim: int
  mechanism: str = 'softmax'
  projection: str = 'standard'
  options: Optional[Mapping[str, Any]] = None
  causal: bool = False
  max_length: Optional[int] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Any = None
  param_dtype: Any = jnp.float32
  attention_cls: Callable[..., nn.Module] = MultiHeadAttention

  @nn.compact
  def __call__(self, x, mask=None, deterministic: bool = True):
    y = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype)(x)
    y = self.attention_cls(
        num_heads=self.num_heads, mechanism=self.mechanism, projection=self.projection,
        options=self.options, causal=self.causal, max_length=self.max_length,
        dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
        param_dtype=self.param_dtype, name='attention')(y, mask=mask, deterministic=deterministic)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    x = x + y
    y = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype)(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, self.param_dtype,
                 name='mlp')(y, deterministic=deterministic)
    return x + y


class Encoder(EncoderBlock):
  """`depth` EncoderBlocks and a final LayerNorm; every other field is the blocks'.

  Subclassing EncoderBlock keeps one list of block fields: each block is built
  from this module's values of them.
  """
  depth: int = 1

  @nn.compact
  def __call__(self, x, mask=None, deterministic: bool = True):
    """x `[batch, length, d_model]`; mask flax-style or None -> same shape."""
    block_fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(EncoderBlock)
                    if f.init and f.name not in ('parent', 'name')}
    for i in range(self.depth):
      x = EncoderBlock(**block_fields, name=f'block_{i}')(x, mask=mask,
                                                          deterministic=deterministic)
    return nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name='final_norm')(x)

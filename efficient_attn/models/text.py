"""Byte-level Transformer text classifier (LRA style) with a configurable attention."""
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn.models.transformer import Encoder


class TextClassifier(nn.Module):
  """Token embedding, learned positions, encoder with padding mask, pooled head.

  Token id 0 is padding. Attributes as `ViT`, plus vocab_size and max_length
  (the longest token sequence; also the context length for 'super'/Linformer).
  """
  num_classes: int
  vocab_size: int
  max_length: int
  d_model: int
  depth: int
  num_heads: int
  mlp_dim: int
  pool: str = 'mean'
  mechanism: str = 'softmax'
  projection: str = 'standard'
  options: Optional[Mapping[str, Any]] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens, *, train: bool = False):
    """tokens `[batch, length]` int (0 = padding) -> logits `[batch, num_classes]`."""
    if self.pool not in ('cls', 'mean'):
      raise ValueError(f"pool={self.pool!r}; valid: 'cls', 'mean'")
    b, n = tokens.shape
    if n > self.max_length:
      raise ValueError(f'input length {n} exceeds max_length={self.max_length}')
    valid = tokens > 0
    x = nn.Embed(self.vocab_size, self.d_model, param_dtype=self.param_dtype,
                 name='embed')(tokens)
    if self.pool == 'cls':
      cls = self.param('cls', nn.initializers.zeros_init(), (1, 1, self.d_model),
                       self.param_dtype)
      x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, self.d_model)).astype(x.dtype), x], 1)
      valid = jnp.concatenate([jnp.ones((b, 1), bool), valid], 1)
    length = x.shape[1]
    max_len = self.max_length + (1 if self.pool == 'cls' else 0)
    pos = self.param('pos_embedding', nn.initializers.normal(0.02),
                     (1, max_len, self.d_model), self.param_dtype)
    x = (x + pos[:, :length]).astype(self.dtype or x.dtype)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    mask = nn.make_attention_mask(valid, valid)
    x = Encoder(depth=self.depth, num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                mechanism=self.mechanism, projection=self.projection, options=self.options,
                max_length=max_len, dropout_rate=self.dropout_rate,
                attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
                param_dtype=self.param_dtype, name='encoder')(
                    x, mask=mask, deterministic=not train)
    if self.pool == 'cls':
      x = x[:, 0]
    else:
      w = valid.astype(x.dtype)[..., None]
      x = (x * w).sum(1) / jnp.maximum(w.sum(1), 1.0)
    return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype,
                    kernel_init=nn.initializers.zeros_init(), name='head')(x).astype(jnp.float32)

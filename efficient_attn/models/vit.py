"""Vision Transformer classifier with a configurable attention layer."""
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn.models.transformer import Encoder


class ViT(nn.Module):
  """Patch embedding, learned positions, encoder, cls or mean pooling, linear head.

  Attributes:
    num_classes: output classes.
    patch_size: square patch side; image sides must be divisible by it.
    d_model, depth, num_heads, mlp_dim: encoder shape.
    pool: 'cls' (prepend a learned token) or 'mean' (average the tokens).
    mechanism, projection, options: the attention layer (see MultiHeadAttention).
    dropout_rate, attention_dropout_rate: dropout.
  The context length (for 'super' and Linformer) is the number of tokens,
  (H / patch) * (W / patch) (+1 with a cls token).
  """
  num_classes: int
  patch_size: int
  d_model: int
  depth: int
  num_heads: int
  mlp_dim: int
  pool: str = 'cls'
  mechanism: str = 'softmax'
  projection: str = 'standard'
  options: Optional[Mapping[str, Any]] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    """images `[batch, height, width, channels]` float -> logits `[batch, num_classes]`."""
    if self.pool not in ('cls', 'mean'):
      raise ValueError(f"pool={self.pool!r}; valid: 'cls', 'mean'")
    _, h, w, _ = images.shape
    p = self.patch_size
    if h % p or w % p:
      raise ValueError(f'image size {h}x{w} is not divisible by patch_size={p}')
    x = nn.Conv(self.d_model, (p, p), strides=(p, p), padding='VALID', dtype=self.dtype,
                param_dtype=self.param_dtype, name='patch_embed')(images)
    b = x.shape[0]
    x = x.reshape(b, -1, self.d_model)
    if self.pool == 'cls':
      cls = self.param('cls', nn.initializers.zeros_init(), (1, 1, self.d_model),
                       self.param_dtype)
      x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, self.d_model)).astype(x.dtype), x], 1)
    n = x.shape[1]
    pos = self.param('pos_embedding', nn.initializers.normal(0.02), (1, n, self.d_model),
                     self.param_dtype)
    x = x + pos.astype(x.dtype)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    x = Encoder(depth=self.depth, num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                mechanism=self.mechanism, projection=self.projection, options=self.options,
                max_length=n, dropout_rate=self.dropout_rate,
                attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
                param_dtype=self.param_dtype, name='encoder')(x, deterministic=not train)
    x = x[:, 0] if self.pool == 'cls' else x.mean(axis=1)
    return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype,
                    kernel_init=nn.initializers.zeros_init(), name='head')(x).astype(jnp.float32)

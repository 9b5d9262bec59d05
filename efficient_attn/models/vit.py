"""Vision Transformer classifier with a configurable attention layer."""

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn.models.transformer import Encoder
from efficient_attn.models.transformer import TransformerConfig


def vit_length(image_size: int, patch_size: int, pool: str) -> int:
  """Tokens the encoder sees: (image_size / patch_size)^2, +1 with a cls token."""
  return (image_size // patch_size) ** 2 + (pool == 'cls')


class ViT(nn.Module):
  """Patch embedding, learned positions, encoder, cls or mean pooling, linear head.

  Attributes:
    config: the encoder's settings; its max_length (the context of 'super' and
      fixed-length mechanisms) is set here to the number of tokens.
    num_classes: output classes.
    patch_size: square patch side; image sides must be divisible by it.
    pool: 'cls' (prepend a learned token) or 'mean' (average the tokens).
  """

  config: TransformerConfig
  num_classes: int
  patch_size: int
  pool: str = 'cls'

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    """images `[batch, height, width, channels]` float -> logits `[batch, num_classes]`."""
    c = self.config
    if self.pool not in ('cls', 'mean'):
      raise ValueError(f"pool={self.pool!r}; valid: 'cls', 'mean'")
    _, h, w, _ = images.shape
    p = self.patch_size
    if h % p or w % p:
      raise ValueError(f'image size {h}x{w} is not divisible by patch_size={p}')
    x = nn.Conv(
      c.d_model,
      (p, p),
      strides=(p, p),
      padding='VALID',
      dtype=c.dtype,
      param_dtype=c.param_dtype,
      name='patch_embed',
    )(images)
    b = x.shape[0]
    x = x.reshape(b, -1, c.d_model)
    if self.pool == 'cls':
      cls = self.param('cls', nn.initializers.zeros_init(), (1, 1, c.d_model), c.param_dtype)
      x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, c.d_model)).astype(x.dtype), x], 1)
    n = x.shape[1]
    pos = self.param(
      'pos_embedding', nn.initializers.normal(0.02), (1, n, c.d_model), c.param_dtype
    )
    x = x + pos.astype(x.dtype)
    x = nn.Dropout(c.dropout_rate)(x, deterministic=not train)
    x = Encoder(c.replace(max_length=n), name='encoder')(x, deterministic=not train)
    x = x[:, 0] if self.pool == 'cls' else x.mean(axis=1)
    return nn.Dense(
      self.num_classes,
      dtype=c.dtype,
      param_dtype=c.param_dtype,
      kernel_init=nn.initializers.zeros_init(),
      name='head',
    )(x).astype(jnp.float32)

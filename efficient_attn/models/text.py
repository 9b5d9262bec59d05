"""Byte-level Transformer text classifier (LRA style) with a configurable attention."""
import flax.linen as nn
import jax.numpy as jnp

from efficient_attn.models.transformer import Encoder
from efficient_attn.models.transformer import TransformerConfig


class TextClassifier(nn.Module):
  """Token embedding, learned positions, encoder with a padding mask, pooled head.

  Token id 0 is padding. The attention layers get the key padding `[batch,
  length]` (padded tokens are never attended to); pooling averages real tokens.
  With `padding=False` every id is a token (pixel values 0..255 as in the Long
  Range Arena's Image and Pathfinder tasks, where 0 is black) and no mask is made.

  Attributes:
    config: the encoder's settings; config.max_length is the longest token
      sequence (also the context of 'super' and fixed-length mechanisms; +1
      with a cls token).
    num_classes: output classes.
    vocab_size: token ids 0..vocab_size-1.
    pool: 'cls' or 'mean'.
    padding: whether id 0 is padding.
  """
  config: TransformerConfig
  num_classes: int
  vocab_size: int
  pool: str = 'mean'
  padding: bool = True

  def context(self) -> int:
    return self.config.max_length + (self.pool == 'cls')

  @nn.compact
  def __call__(self, tokens, *, train: bool = False):
    """tokens `[batch, length]` int (0 = padding if `padding`) -> logits `[batch, num_classes]`."""
    c = self.config
    if self.pool not in ('cls', 'mean'):
      raise ValueError(f"pool={self.pool!r}; valid: 'cls', 'mean'")
    b, n = tokens.shape
    if n > c.max_length:
      raise ValueError(f'input length {n} exceeds max_length={c.max_length}')
    valid = tokens > 0 if self.padding else jnp.ones((b, n), bool)
    x = nn.Embed(self.vocab_size, c.d_model, param_dtype=c.param_dtype, name='embed')(tokens)
    if self.pool == 'cls':
      cls = self.param('cls', nn.initializers.zeros_init(), (1, 1, c.d_model),
                       c.param_dtype)
      x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, c.d_model)).astype(x.dtype), x], 1)
      valid = jnp.concatenate([jnp.ones((b, 1), bool), valid], 1)
    pos = self.param('pos_embedding', nn.initializers.normal(0.02),
                     (1, self.context(), c.d_model), c.param_dtype)
    x = (x + pos[:, :x.shape[1]]).astype(c.dtype or x.dtype)
    x = nn.Dropout(c.dropout_rate)(x, deterministic=not train)
    x = Encoder(c.replace(max_length=self.context()), name='encoder')(
        x, mask=valid if self.padding else None, deterministic=not train)
    if self.pool == 'cls':
      x = x[:, 0]
    else:
      w = valid.astype(x.dtype)[..., None]
      x = (x * w).sum(1) / jnp.maximum(w.sum(1), 1.0)
    return nn.Dense(self.num_classes, dtype=c.dtype, param_dtype=c.param_dtype,
                    kernel_init=nn.initializers.zeros_init(), name='head')(x).astype(jnp.float32)

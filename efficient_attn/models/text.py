"""Byte-level Transformer text models (LRA style) with a configurable attention.

`TextClassifier` reads one sequence; `TextMatcher` reads a pair through one
shared encoder (the dual encoder of LRA's Retrieval task).
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from efficient_attn.models.transformer import Encoder
from efficient_attn.models.transformer import TransformerConfig

POOLS = ('cls', 'mean')
POSITIONS = ('learned', 'sinusoidal')
INTERACTIONS = ('concat', 'nli')


def sinusoidal_positions(length: int, d_model: int) -> np.ndarray:
  """Fixed 1D positions `[1, length, d_model]` (Vaswani et al. 2017): sin on even features,
  cos on odd ones, wavelengths 2 pi .. 10000 * 2 pi (LRA's default, `learn_pos_emb=False`)."""
  position = np.arange(length)[:, None]
  rate = np.exp(np.arange(0, d_model, 2) * -(np.log(10000.0) / d_model))
  table = np.zeros((length, d_model), np.float32)
  table[:, 0::2] = np.sin(position * rate)
  table[:, 1::2] = np.cos(position * rate)[:, : d_model // 2]
  return table[None]


def encode(
  module: nn.Module,
  c: TransformerConfig,
  tokens,
  *,
  vocab_size: int,
  pool: str,
  padding: bool,
  train: bool,
  positions: str = 'learned',
):
  """tokens `[batch, length]` -> pooled features `[batch, d_model]`, inside `module`'s scope.

  Token embedding, positions (learned, or fixed sinusoids), the encoder with a
  key-padding mask, then the cls token or the mean over real tokens. Called
  from the compact method of the module that owns the parameters ('embed',
  'cls', 'pos_embedding', 'encoder').
  """
  if pool not in POOLS:
    raise ValueError(f'pool={pool!r} is not valid; valid choices: {", ".join(POOLS)}')
  if positions not in POSITIONS:
    raise ValueError(f'positions={positions!r} is not valid; valid choices: {", ".join(POSITIONS)}')
  b, n = tokens.shape
  if c.max_length is None or n > c.max_length:
    raise ValueError(f'input length {n} exceeds max_length={c.max_length}')
  cls = pool == 'cls'
  valid = tokens > 0 if padding else jnp.ones((b, n), bool)
  x = nn.Embed(vocab_size, c.d_model, param_dtype=c.param_dtype, name='embed')(tokens)
  if cls:
    token = module.param('cls', nn.initializers.zeros_init(), (1, 1, c.d_model), c.param_dtype)
    x = jnp.concatenate([jnp.broadcast_to(token, (b, 1, c.d_model)).astype(x.dtype), x], 1)
    valid = jnp.concatenate([jnp.ones((b, 1), bool), valid], 1)
  context = c.max_length + cls
  if positions == 'learned':
    pos = module.param(
      'pos_embedding', nn.initializers.normal(0.02), (1, context, c.d_model), c.param_dtype
    )
  else:
    pos = jnp.asarray(sinusoidal_positions(context, c.d_model))
  x = (x + pos[:, : x.shape[1]]).astype(c.dtype or x.dtype)
  x = nn.Dropout(c.dropout_rate)(x, deterministic=not train)
  x = Encoder(c.replace(max_length=context), name='encoder')(
    x, mask=valid if padding else None, deterministic=not train
  )
  if cls:
    return x[:, 0]
  w = valid.astype(x.dtype)[..., None]
  return (x * w).sum(1) / jnp.maximum(w.sum(1), 1.0)


class TextClassifier(nn.Module):
  """Token embedding, positions, encoder with a padding mask, pooled head.

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
    positions: 'learned' or 'sinusoidal' (fixed).
  """

  config: TransformerConfig
  num_classes: int
  vocab_size: int
  pool: str = 'mean'
  padding: bool = True
  positions: str = 'learned'

  @nn.compact
  def __call__(self, tokens, *, train: bool = False):
    """tokens `[batch, length]` int (0 = padding if `padding`) -> logits `[batch, num_classes]`."""
    c = self.config
    x = encode(
      self,
      c,
      tokens,
      vocab_size=self.vocab_size,
      pool=self.pool,
      padding=self.padding,
      train=train,
      positions=self.positions,
    )
    return nn.Dense(
      self.num_classes,
      dtype=c.dtype,
      param_dtype=c.param_dtype,
      kernel_init=nn.initializers.zeros_init(),
      name='head',
    )(x).astype(jnp.float32)


class _Tower(nn.Module):
  """One encoder applied to each document of a pair (shared parameters)."""

  config: TransformerConfig
  vocab_size: int
  pool: str
  positions: str = 'learned'

  @nn.compact
  def __call__(self, tokens, *, train: bool):
    return encode(
      self,
      self.config,
      tokens,
      vocab_size=self.vocab_size,
      pool=self.pool,
      padding=True,
      train=train,
      positions=self.positions,
    )


class TextMatcher(nn.Module):
  """A dual encoder for pairs of documents (LRA's Retrieval task, Tay et al. 2021).

  Both documents go through one encoder (shared parameters, as LRA's
  `TransformerDualEncoder`); the pooled features e1, e2 are joined as [e1, e2]
  ('concat', LRA's default) or [e1, e2, e1 * e2, e1 - e2] ('nli'), then an MLP
  of widths mlp_dim, mlp_dim // 2 with ReLU gives the logits (LRA's
  `classifier_head_dual`).

  Attributes:
    config: the encoder's settings; config.max_length is the longest document.
    num_classes: output classes.
    vocab_size: token ids 0..vocab_size-1 (0 = padding).
    pool: 'cls' or 'mean'.
    interaction: 'concat' or 'nli'.
    positions: 'learned' or 'sinusoidal' (fixed).
  """

  config: TransformerConfig
  num_classes: int
  vocab_size: int
  pool: str = 'mean'
  interaction: str = 'concat'
  positions: str = 'learned'

  @nn.compact
  def __call__(self, tokens, *, train: bool = False):
    """tokens `[batch, 2, length]` int (0 = padding) -> logits `[batch, num_classes]`."""
    c = self.config
    if tokens.ndim != 3 or tokens.shape[1] != 2:
      raise ValueError(
        f'TextMatcher takes token pairs [batch, 2, length], got shape {tokens.shape}'
      )
    if self.interaction not in INTERACTIONS:
      raise ValueError(
        f'interaction={self.interaction!r} is not valid; valid choices: {", ".join(INTERACTIONS)}'
      )
    tower = _Tower(c, self.vocab_size, self.pool, self.positions, name='tower')
    e1, e2 = tower(tokens[:, 0], train=train), tower(tokens[:, 1], train=train)
    parts = [e1, e2] + ([e1 * e2, e1 - e2] if self.interaction == 'nli' else [])
    x = jnp.concatenate(parts, -1)
    dense = lambda n, name: nn.Dense(n, dtype=c.dtype, param_dtype=c.param_dtype, name=name)
    x = nn.relu(dense(c.mlp_dim, 'mlp')(x))
    x = nn.relu(dense(max(c.mlp_dim // 2, 1), 'mlp2')(x))
    return dense(self.num_classes, 'head')(x).astype(jnp.float32)

"""Decoder-only Transformer over token ids (pixel intensities), with decoding.

    model = CausalTransformer(vocab_size=256, max_length=784, d_model=64, depth=2,
                              num_heads=4, mlp_dim=128, mechanism='linear')
    logits = model.apply(params, shift_right(pixels, model.start_token))   # training
    # generation: model.clone(decode=True), one token `[batch, 1]` per call,
    # state in the 'cache' collection (see `train/generate.py`).
"""
import functools
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn.attention import MultiHeadAttention
from efficient_attn.models.transformer import Encoder


def shift_right(tokens: jnp.ndarray, start_token: int) -> jnp.ndarray:
  """`[batch, length]` targets -> inputs `[start, t_0, ..., t_{length-2}]`."""
  start = jnp.full(tokens.shape[:1] + (1,), start_token, tokens.dtype)
  return jnp.concatenate([start, tokens[:, :-1]], axis=1)


class CausalTransformer(nn.Module):
  """Token embedding (+ a start token), learned positions, causal Encoder, logits.

  Attributes:
    vocab_size: output classes (256 pixel intensities); inputs also take the
      start token id `vocab_size`.
    max_length: longest sequence (784 for 28 x 28 images); the positions table
      and the context length for 'super'.
    d_model, depth, num_heads, mlp_dim: encoder shape.
    mechanism, projection, options: the attention layer; the mechanism needs a
      causal form, and a decoding form for `decode=True`.
    dropout_rate, attention_dropout_rate: dropout.
    decode: one token per call, the attention states and the position in the
      'cache' collection, created by the first call without one (pass a
      full-length `[batch, max_length]` input then; see `MultiHeadAttention`).
  """
  vocab_size: int = 256
  max_length: int = 784
  d_model: int = 64
  depth: int = 2
  num_heads: int = 4
  mlp_dim: int = 128
  mechanism: str = 'linear'
  projection: str = 'standard'
  options: Optional[Mapping[str, Any]] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Any = None
  param_dtype: Any = jnp.float32
  decode: bool = False

  @property
  def start_token(self) -> int:
    return self.vocab_size

  @nn.compact
  def __call__(self, tokens, *, train: bool = False):
    """tokens `[batch, length]` int in [0, vocab_size] (inputs, already shifted
    right) -> logits `[batch, length, vocab_size]` float32. In a decoding step
    `length` is 1 and the position comes from the cache."""
    n = tokens.shape[1]
    if n > self.max_length:
      raise ValueError(f'input length {n} exceeds max_length={self.max_length}')
    x = nn.Embed(self.vocab_size + 1, self.d_model, param_dtype=self.param_dtype,
                 name='embed')(tokens)
    pos = self.param('pos_embedding', nn.initializers.normal(0.02),
                     (1, self.max_length, self.d_model), self.param_dtype)
    if self.decode and self.has_variable('cache', 'position'):
      position = self.variable('cache', 'position', jnp.zeros, (), jnp.int32)
      x = x + jnp.take(pos, position.value + jnp.arange(n), axis=1)
      position.value = position.value + n
    else:
      if self.decode:  # first call: create the position counter
        self.variable('cache', 'position', jnp.zeros, (), jnp.int32)
      x = x + pos[:, :n]
    x = x.astype(self.dtype or x.dtype)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    x = Encoder(depth=self.depth, num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                mechanism=self.mechanism, projection=self.projection, options=self.options,
                causal=True, max_length=self.max_length, dropout_rate=self.dropout_rate,
                attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
                param_dtype=self.param_dtype,
                attention_cls=functools.partial(MultiHeadAttention, decode=self.decode),
                name='decoder')(x, deterministic=not train)
    return nn.Dense(self.vocab_size, dtype=self.dtype, param_dtype=self.param_dtype,
                    name='logits')(x).astype(jnp.float32)

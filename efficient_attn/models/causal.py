"""Decoder-only Transformer over token ids (pixel intensities), with decoding.

model = CausalTransformer(TransformerConfig(d_model=64, depth=2, num_heads=4,
                          mlp_dim=128, mechanism='linear', max_length=784),
                          vocab_size=256)
logits = model.apply(params, shift_right(pixels, model.start_token))   # training
# generation: model.clone(decode=True), the prompt in one call (a prefill), then one
# token `[batch, 1]` per call, state in the 'cache' collection (see
# `efficient_attn.models.sampling`).
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn.layers import cache
from efficient_attn.models.transformer import Encoder
from efficient_attn.models.transformer import TransformerConfig
from efficient_attn.ops import segments
from efficient_attn.ops import traced_checks


def shift_right(tokens: jnp.ndarray, start_token: int) -> jnp.ndarray:
  """`[batch, length]` targets -> inputs `[start, t_0, ..., t_{length-2}]`."""
  start = jnp.full(tokens.shape[:1] + (1,), start_token, tokens.dtype)
  return jnp.concatenate([start, tokens[:, :-1]], axis=1)


class CausalTransformer(nn.Module):
  """Token embedding (+ a start token), learned positions, causal Encoder, logits.

  Attributes:
    config: the decoder's settings; max_length is the longest sequence (784
      for 28 x 28 images: the positions table and the context of 'super'). It
      is made causal here; the mechanism needs a causal form, and a decoding
      form for `decode=True`.
    vocab_size: output classes (256 pixel intensities); inputs also take the
      start token id `vocab_size`.
    decode: one token per call, the attention states and the position in the
      'cache' collection, created by the first call without one (pass a
      full-length `[batch, max_length]` input then; see `MultiHeadAttention`).
  """

  config: TransformerConfig
  vocab_size: int = 256
  decode: bool = False

  @property
  def start_token(self) -> int:
    return self.vocab_size

  @property
  def max_length(self) -> Optional[int]:
    return self.config.max_length

  @nn.nowrap
  def generate(self, params, prompt, max_new_tokens: int, **options):
    """`efficient_attn.models.generate.generate(self, params, prompt, max_new_tokens,
    **options)`: the prompt `[batch, P]` prefilled in one decoding call, then up to
    `max_new_tokens` tokens sampled per row (temperature, top_k, top_p, eos_id, rng,
    prompt_lengths)."""
    from efficient_attn.models import generate as generate_lib

    return generate_lib.generate(self, params, prompt, max_new_tokens, **options)

  @nn.compact
  def __call__(
    self,
    tokens,
    *,
    train: bool = False,
    positions=None,
    segment_ids=None,
    segment_positions=None,
  ):
    """tokens `[batch, length]` int in [0, vocab_size] (inputs, already shifted
    right) -> logits `[batch, length, vocab_size]` float32. `positions` `[batch, k]`
    int: the logits at those positions only, `[batch, k, vocab_size]` (a task
    scored at a few positions skips the vocabulary head everywhere else).

    Packed rows: `segment_ids` `[batch, length]` int (0 is padding) confine each token's
    attention to its own document, and the learned positions restart at each document
    (`segment_positions` `[batch, length]`, default `ops.segments.positions`).

    Decoding (`decode=True`, the cache created): a call of n tokens (1: a step; more: a
    prefill, one parallel pass) continues from the cache, the positions from where each
    row's document stands (with `segment_ids`, a row whose id differs from its last real
    token's starts a new document, at position 0).
    """
    c = self.config.replace(causal=True, decode=self.decode)
    n = tokens.shape[1]
    if c.max_length is None or n > c.max_length:
      raise ValueError(f'input length {n} exceeds max_length={c.max_length}')
    if segment_ids is not None:
      segment_ids = segments.check(segment_ids, tokens.shape[0], n, 'CausalTransformer')
    x = nn.Embed(self.vocab_size + 1, c.d_model, param_dtype=c.param_dtype, name='embed')(tokens)
    pos = self.param(
      'pos_embedding', nn.initializers.normal(0.02), (1, c.max_length, c.d_model), c.param_dtype
    )
    if self.decode and self.has_variable('cache', 'position'):
      index = self.variable('cache', 'position', jnp.zeros, (), jnp.int32)
      documents = self.variable('cache', 'documents', cache.init_documents, tokens.shape[0])
      documents.value, stand = cache.track(documents.value, segment_ids, index.value, n)
      at = stand.positions if segment_positions is None else segment_positions
      traced_checks.runtime_check(
        jnp.max(at) < c.max_length,
        'decoding step at position {} is past max_length={} (the learned '
        'positions table); build the model with a longer max_length',
        jnp.max(at),
        c.max_length,
      )
      index.value = index.value + n
    else:
      if self.decode:  # first call: create the position counter and the rows' documents
        self.variable('cache', 'position', jnp.zeros, (), jnp.int32)
        self.variable('cache', 'documents', cache.init_documents, tokens.shape[0])
      at = segment_positions
      if at is None and segment_ids is not None:
        at = segments.positions(segment_ids)
    if at is None:
      x = x + pos[:, :n]
    else:
      x = x + jnp.take(pos[0], jnp.asarray(at, jnp.int32), axis=0)
    x = x.astype(c.dtype or x.dtype)
    x = nn.Dropout(c.dropout_rate)(x, deterministic=not train)
    x = Encoder(c, name='decoder')(
      x, deterministic=not train, segment_ids=segment_ids, positions=at
    )
    if positions is not None:
      x = jnp.take_along_axis(x, positions[..., None], axis=1)
    return nn.Dense(self.vocab_size, dtype=c.dtype, param_dtype=c.param_dtype, name='logits')(
      x
    ).astype(jnp.float32)

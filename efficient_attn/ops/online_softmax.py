"""Online softmax: exact attention accumulated over blocks of keys.

    state = online_softmax.init(batch, heads, q_len, v_dim, dtype)
    for each key block:  state = online_softmax.update(state, scores, valid, values)
    out = online_softmax.finish(state)            # [batch, heads, q_len, v_dim]

The running maximum m, normaliser l and weighted sum acc of Milakov &
Gimelshein (2018) / Rabe & Staats (2021): after every block, acc / l equals
softmax attention over the keys seen so far, and no block's scores outlive
its update. Used by the memory-efficient softmax and by key/value-cache
decoding; scores are float32 (or wider) throughout.
"""

from typing import NamedTuple

import jax.numpy as jnp

from efficient_attn.ops import masking


class State(NamedTuple):
  """m `[b, h, q]` running max, l `[b, h, q]` normaliser, acc `[b, h, q, dv]`."""

  m: jnp.ndarray
  l: jnp.ndarray
  acc: jnp.ndarray


def init(batch: int, heads: int, q_len: int, v_dim: int, dtype=jnp.float32) -> State:
  """The state before any key: m at a large negative number, l and acc zero."""
  return State(
    jnp.full((batch, heads, q_len), masking.big_neg(dtype), dtype),
    jnp.zeros((batch, heads, q_len), dtype),
    jnp.zeros((batch, heads, q_len, v_dim), dtype),
  )


def update(state: State, scores: jnp.ndarray, valid, values: jnp.ndarray) -> State:
  """Adds one block of keys.

  Args:
    state: the running `State`.
    scores: `[b, h, q, k]` scaled scores of the block, in the state's dtype.
    valid: bool broadcastable to scores (False: the key is masked), or None.
    values: `[b, k, h, dv]` in the state's dtype.
  """
  if valid is not None:
    scores = jnp.where(valid, scores, masking.big_neg(scores.dtype))
  m_new = jnp.maximum(state.m, scores.max(axis=-1))
  p = jnp.exp(scores - m_new[..., None])
  if valid is not None:
    p = jnp.where(valid, p, 0.0)  # where, not p * valid: exact 0 whatever the score held
  corr = jnp.exp(state.m - m_new)
  return State(
    m_new,
    state.l * corr + p.sum(axis=-1),
    state.acc * corr[..., None] + jnp.einsum('bhqk,bkhd->bhqd', p, values),
  )


def finish(state: State) -> jnp.ndarray:
  """acc / l `[b, h, q, dv]`; rows that saw no valid key are 0."""
  return state.acc / jnp.where(state.l == 0, 1.0, state.l)[..., None]

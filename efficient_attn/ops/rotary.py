"""Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer").

    q, k = rotate(q, positions), rotate(k, positions)     # [batch, length, heads, dim]

Each pair of feature dimensions (i, i + dim/2) of a vector at position p is
rotated by the angle p * base^(-2i/dim), so the dot product of a rotated query
at position m and a rotated key at position n depends on m and n only through
m - n: attention scores become relative. In the linear-attention form of
RoFormer (section 3.3) the *features* phi(q), phi(k) are rotated in the
numerator only; the denominator stays unrotated, so it keeps its sign.
"""

from typing import Any, Dict

import jax.numpy as jnp

BASE = 10000.0


def angles(positions, dim: int, base: float = BASE):
  """(cos, sin) of the rotation angles, `[..., dim / 2]` for positions `[...]` (float32)."""
  if dim % 2:
    raise ValueError(f'rotary embeddings rotate pairs of features; the dimension {dim} is odd')
  inv = base ** (-jnp.arange(0, dim // 2, dtype=jnp.float32) * 2.0 / dim)
  theta = jnp.asarray(positions, jnp.float32)[..., None] * inv
  return jnp.cos(theta), jnp.sin(theta)


def rotate(x, positions, base: float = BASE):
  """x `[..., heads, dim]` rotated at `positions`, shaped like x's axes before heads
  or broadcastable to them: `[length]` or `[batch, length]` for x `[batch, length,
  heads, dim]`, a scalar (or `[batch]`) for one token `[batch, heads, dim]`.

  Computed in float32 (or wider); returned in x's dtype.
  """
  cos, sin = angles(positions, x.shape[-1], base)  # positions.shape + [dim/2]
  cos, sin = cos[..., None, :], sin[..., None, :]  # a heads axis
  compute = jnp.promote_types(x.dtype, jnp.float32)
  x1, x2 = jnp.split(x.astype(compute), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def positions_of(q_length: int, kv_length: int):
  """(query positions, key positions) of a full sequence: 0..q_length-1, 0..kv_length-1."""
  return jnp.arange(q_length), jnp.arange(kv_length)


def numerator(phi_q, phi_k, positions) -> Dict[str, Any]:
  """Keyword arguments `num_q`, `num_k` of `linear_attention.KernelFeatures` (their fields):
  the features rotated at `positions` = (query positions, key positions) for
  RoFormer's rotary linear attention, or none when `positions` is None."""
  if positions is None:
    return {}
  q_positions, k_positions = positions
  try:
    return dict(num_q=rotate(phi_q, q_positions), num_k=rotate(phi_k, k_positions))
  except ValueError as e:
    raise ValueError(
      f'rotary positions on kernel features of dimension {phi_q.shape[-1]}: '
      f'{e}; use an even number of features'
    ) from None


def at(position):
  """(position, position) of one decoding step, or None (no rotary positions)."""
  return None if position is None else (position, position)

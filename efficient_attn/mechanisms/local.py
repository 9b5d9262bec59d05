"""Sliding-window (banded) attention computed in blocks, O(n w).

Exact softmax attention restricted to a band around the diagonal:
  * non-causal: query i attends to key j iff |i - j| <= window // 2
    (2 * (window // 2) + 1 keys away from the edges);
  * causal: query i attends to key j iff i - window < j <= i
    (the window most recent keys, itself included).

The sequence is cut into blocks; each query block attends to the concatenation
of its own key block and as many neighbouring blocks as the band reaches, with
the exact band mask applied inside, so no n x n array is ever formed: time and
memory O(n (w + block)) per head. Self-attention only (q_length == kv_length).
Shapes follow `efficient_attn.mechanisms.base.Mechanism`.
"""
import math
from typing import Optional

import jax
import jax.numpy as jnp

from efficient_attn import masking
from efficient_attn.mechanisms.base import Mechanism


def _blocks_with_neighbours(x, block: int, left: int, right: int, num_blocks: int):
  """`x` `[b, n, ...]` -> `[b, num_blocks, (left + 1 + right) * block, ...]`.

  Row c holds blocks c - left .. c + right of the zero-padded sequence.
  """
  n = x.shape[1]
  pad = [(0, 0)] * x.ndim
  pad[1] = (left * block, (num_blocks + right) * block - n)
  xp = jnp.pad(x, pad)
  xb = xp.reshape((x.shape[0], num_blocks + left + right, block) + x.shape[2:])
  parts = [xb[:, i:i + num_blocks] for i in range(left + right + 1)]
  return jnp.concatenate(parts, axis=2)


def local_attention(q, k, v, window: int, mask=None, causal: bool = False,
                    scale: Optional[float] = None, block_size: Optional[int] = None):
  """Exact softmax attention within a sliding window, blocked.

  Query i attends key j iff |i - j| <= window // 2 (non-causal) or
  i - window < j <= i (causal), and key j is not padded. Queries with no
  attendable key return 0. Scores and softmax run in float32 (or wider); the
  result has the dtype of `v`.

  Cost: with block size B (default max(window // 2, 1) non-causal, window
  causal; capped at n) and r = ceil(reach / B) neighbour blocks, where reach =
  window // 2 (non-causal, on each side) or window - 1 (causal, to the left),
  each block of B queries attends to (2 r + 1) B (non-causal) or (r + 1) B
  (causal) keys. With the defaults that is 3 B ~ 1.5 w or 2 w keys per query:
  time O(n w d) and memory O(n w) per head.

  Masking: the mask is reduced to key padding with
  `masking.key_padding_from_mask` (a flax-style `[batch, heads, q_length,
  kv_length]` mask keeps a key if any query may attend to it); the band itself
  comes from `window` and `causal`, not from the mask.

  Args:
    q: `[batch, n, heads, head_dim]`.
    k: `[batch, n, heads, head_dim]`.
    v: `[batch, n, heads, v_dim]`.
    window: window size w >= 1 (see above).
    mask: optional bool key padding `[batch, n]` or flax-style mask; True = attend.
    causal: use the causal window.
    scale: score scale, default 1/sqrt(head_dim).
    block_size: query/key block size; any value >= 1 is exact.

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`.
  """
  b, n, h, d = q.shape
  if k.shape[1] != n:
    raise ValueError(f'local_attention needs q_length == kv_length, got {n} and {k.shape[1]}')
  if window < 1:
    raise ValueError(f'window must be >= 1, got {window}')
  half = window // 2
  reach = window - 1 if causal else half
  if block_size is None:
    block_size = window if causal else max(half, 1)
  if block_size < 1:
    raise ValueError(f'block_size must be >= 1, got {block_size}')
  block = min(block_size, n)
  num_blocks = -(-n // block)
  left = min(-(-reach // block), num_blocks - 1)
  right = 0 if causal else left
  scale = 1.0 / math.sqrt(d) if scale is None else scale
  compute = jnp.promote_types(jnp.promote_types(q.dtype, v.dtype), jnp.float32)

  key_padding = masking.key_padding_from_mask(mask, b, n)
  if key_padding is None:
    key_padding = jnp.ones((b, n), bool)

  qb = jnp.pad(q, ((0, 0), (0, num_blocks * block - n), (0, 0), (0, 0)))
  qb = qb.reshape(b, num_blocks, block, h, d).astype(compute)
  kb = _blocks_with_neighbours(k, block, left, right, num_blocks).astype(compute)
  vb = _blocks_with_neighbours(v, block, left, right, num_blocks).astype(compute)
  kpb = _blocks_with_neighbours(key_padding, block, left, right, num_blocks)  # [b, c, t]

  width = (left + right + 1) * block
  c = jnp.arange(num_blocks)[:, None, None]
  qpos = c * block + jnp.arange(block)[None, :, None]                 # [c, B, 1]
  kpos = (c - left) * block + jnp.arange(width)[None, None, :]        # [c, 1, t]
  if causal:
    band = (kpos <= qpos) & (kpos > qpos - window)
  else:
    band = jnp.abs(qpos - kpos) <= half
  band = band & (kpos >= 0) & (kpos < n)                              # [c, B, t]
  valid = band[None, :, None] & kpb[:, :, None, None, :]              # [b, c, 1, B, t]

  s = jnp.einsum('bcqhd,bckhd->bchqk', qb, kb) * scale                # [b, c, h, B, t]
  s = jnp.where(valid, s, masking.big_neg(compute))
  w = jax.nn.softmax(s, axis=-1)
  w = jnp.where(valid, w, 0.0)
  out = jnp.einsum('bchqk,bckhd->bcqhd', w, vb)
  out = out.reshape(b, num_blocks * block, h, -1)[:, :n]
  return out.astype(v.dtype)


class LocalAttention(Mechanism):
  """Linen wrapper of `local_attention` (no parameters).

  Attributes:
    window: window size (see `local_attention` for the exact band).
    block_size: block size, None for the default.
    scale: score scale, default 1/sqrt(head_dim).
  """
  window: int = 64
  block_size: Optional[int] = None
  scale: Optional[float] = None

  def __call__(self, q, k, v, mask=None, deterministic: bool = True):
    del deterministic
    dtype = self.dtype or q.dtype
    return local_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), self.window,
                           mask=mask, causal=self.causal, scale=self.scale,
                           block_size=self.block_size)

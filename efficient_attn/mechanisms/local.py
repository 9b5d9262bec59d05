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
Shapes follow `efficient_attn.registry.Mechanism.attend`.

`band_blocks` builds the blocked band (queries, keys, values, band mask) once;
`local_attention` and the mechanisms that add other keys to the band
(Longformer's global tokens, the Sparse Transformer's strided pattern) all
call it and take the softmax with `block_sparse.attend`.
"""

from typing import NamedTuple, Optional

import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import block_sparse
from efficient_attn.ops import collectives
from efficient_attn.ops import masking
from efficient_attn.ops.scaled_dot_product import default_scale
from efficient_attn.ops.scaled_dot_product import documents_of


def _blocks_with_neighbours(x, block: int, left: int, right: int, num_blocks: int):
  """`x` `[b, n, ...]` -> `[b, num_blocks, (left + 1 + right) * block, ...]`.

  Row c holds blocks c - left .. c + right of the zero-padded sequence.
  """
  n = x.shape[1]
  pad = [(0, 0)] * x.ndim
  pad[1] = (left * block, (num_blocks + right) * block - n)
  xp = jnp.pad(x, pad)
  xb = xp.reshape((x.shape[0], num_blocks + left + right, block) + x.shape[2:])
  parts = [xb[:, i : i + num_blocks] for i in range(left + right + 1)]
  return jnp.concatenate(parts, axis=2)


class Band(NamedTuple):
  """The blocked band of `band_blocks`.

  Attributes:
    queries: `[batch, num_blocks, block, heads, head_dim]`, zero-padded to
      num_blocks * block positions.
    segment: the band keys and values of each query block, a
      `block_sparse.Segment` in the 'block' layout (`[batch, num_blocks, t,
      heads, dim]`, t = (left + 1 + right) * block) whose `valid`
      `[batch, num_blocks, 1, block, t]` is the band, the sequence bounds and
      the key padding.
    key_pos: int `[1, num_blocks, 1, 1, t]`, the sequence position of each
      band key (outside [0, n) for padding), broadcastable to `segment.valid`.
  """

  queries: jnp.ndarray
  segment: block_sparse.Segment
  key_pos: jnp.ndarray


def band_blocks(
  q,
  k,
  v,
  key_padding,
  window: int,
  causal: bool = False,
  block_size: Optional[int] = None,
  documents=None,
) -> Band:
  """Blocks the band |i - j| <= window // 2 (causal: i - window < j <= i).

  Args:
    q: `[batch, n, heads, head_dim]`.
    k: `[batch, n, heads, head_dim]`.
    v: `[batch, n, heads, v_dim]`.
    key_padding: bool `[batch, n]`, True for real keys.
    window: window size w >= 1.
    causal: use the causal band.
    block_size: query/key block size (see `local_attention` for the default).
    documents: a `masking.document_pair` over the n tokens (a packed row: the band is
      clipped at each document's bounds) or None.

  Returns:
    A `Band`; `block_sparse.attend(band.queries, [band.segment], scale)` is
    local attention, `[batch, num_blocks, block, heads, v_dim]`. Memory
    O(n (w + block)) per head.
  """
  b, n, h, d = q.shape
  registry.check_arguments(
    'local', 'local attention (band_blocks)', window=window, block_size=block_size
  )
  half = window // 2
  reach = window - 1 if causal else half
  if block_size is None:
    block_size = window if causal else max(half, 1)
  block = min(block_size, n)
  num_blocks = -(-n // block)
  left = min(-(-reach // block), num_blocks - 1)
  right = 0 if causal else left

  qb = jnp.pad(q, ((0, 0), (0, num_blocks * block - n), (0, 0), (0, 0)))
  qb = qb.reshape(b, num_blocks, block, h, d)
  kb = _blocks_with_neighbours(k, block, left, right, num_blocks)
  vb = _blocks_with_neighbours(v, block, left, right, num_blocks)
  kpb = _blocks_with_neighbours(key_padding, block, left, right, num_blocks)  # [b, c, t]

  width = (left + right + 1) * block
  c = jnp.arange(num_blocks)[:, None, None]
  qpos = c * block + jnp.arange(block)[None, :, None]  # [c, B, 1]
  kpos = (c - left) * block + jnp.arange(width)[None, None, :]  # [c, 1, t]
  if causal:
    band = (kpos <= qpos) & (kpos > qpos - window)
  else:
    band = jnp.abs(qpos - kpos) <= half
  band = band & (kpos >= 0) & (kpos < n)  # [c, B, t]
  valid = band[None, :, None] & kpb[:, :, None, None, :]  # [b, c, 1, B, t]
  if documents is not None:
    query_docs = jnp.pad(
      documents[0], ((0, 0), (0, num_blocks * block - n)), constant_values=masking.NO_QUERY
    ).reshape(b, num_blocks, block)
    key_docs = _blocks_with_neighbours(documents[1], block, left, right, num_blocks)  # [b, c, t]
    valid = valid & (query_docs[:, :, None, :, None] == key_docs[:, :, None, None, :])
  return Band(qb, block_sparse.Segment('block', kb, vb, valid), kpos[None, :, None])


def local_attention(
  q,
  k,
  v,
  window: int,
  mask=None,
  causal: bool = False,
  scale: Optional[float] = None,
  block_size: Optional[int] = None,
  segment_ids=None,
  *,
  documents=None,
):
  """Exact softmax attention within a sliding window, blocked.

  Query i attends key j iff `|i - j| <= window // 2` (non-causal) or
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
    segment_ids: int `[batch, n]`, a packed row (0 is padding, docs/design.md
      "Documents"): the window is clipped at each document's bounds, and a padding
      token's output is 0. None: one document per row.
    documents: the same as a `masking.document_pair` (`ctx.documents`), instead.

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`.
  """
  b, n, _, d = q.shape
  if k.shape[1] != n:
    raise ValueError(f'local_attention needs q_length == kv_length, got {n} and {k.shape[1]}')
  padding = block_sparse.key_padding(mask, b, n)
  documents = documents_of(segment_ids, documents, q, k, 'local_attention')
  band = band_blocks(q, k, v, padding, window, causal, block_size, documents)
  out = block_sparse.attend(band.queries, [band.segment], default_scale(d, scale))
  out = out.reshape(b, -1, out.shape[3], out.shape[4])[:, :n]
  return out.astype(v.dtype)


@registry.register
class Local(registry.Mechanism):
  name = 'local'
  rotary = 'scores'
  description = 'sliding-window attention in blocks'
  citation = 'Parmar et al. 2018; Beltagy et al. 2020'
  options = (
    registry.Option(
      'window', 32, int, 'window size w (see local_attention for the band)', minimum=1
    ),
    registry.Option(
      'block_size', None, int, 'query/key block size; None: the default', minimum=1, allow_none=True
    ),
    SCALE,
  )
  causal = True
  decode = 'kv_cache'
  self_attention_only = True
  sequence_parallel = 'halo'
  segments = True
  complexity = ('O(n w d)', 'O(n w)')
  knob = ('window', (16, 32, 64, 128, 256, 512, '2n'))
  example = {'window': 4}

  def exact_options(self, length):
    return {'window': 2 * length}

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return local_attention(
      q,
      k,
      v,
      options.window,
      mask=mask,
      causal=causal,
      scale=options.scale,
      block_size=options.block_size,
      documents=masking.context_documents(ctx.documents, mask, *q.shape[:2], k.shape[1], 'local'),
    )

  def kv_window(self, options):
    return options.window

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    """Local attention on one device's block: its keys and values with the halo the band
    reaches, the previous devices' last window - 1 (causal) or window // 2 tokens and,
    bidirectional, the next devices' first window // 2 (`collectives.with_halo`; keys past
    the sequence's ends are padding). A packed row's halo carries its documents
    (`ctx.documents`, this block's slice of the row's index), so it reads only the
    queries' own documents."""
    b, m = q.shape[:2]
    before, after = (
      (options.window - 1, 0) if causal else (options.window // 2, options.window // 2)
    )
    padding = jnp.ones((b, m), bool) if mask is None else mask
    k, v, padding = (collectives.with_halo(x, before, after, axis) for x in (k, v, padding))
    documents = None
    if ctx.documents is not None:
      index = collectives.with_halo(jnp.asarray(ctx.documents, jnp.int32), before, after, axis)
      documents = masking.document_pair(index, padding, padding)
    q = jnp.pad(q, ((0, 0), (before, after), (0, 0), (0, 0)))
    out = local_attention(
      q,
      k,
      v,
      options.window,
      mask=padding,
      causal=causal,
      scale=options.scale,
      block_size=options.block_size,
      documents=documents,
    )
    return out[:, before : before + m]

"""Sparse Transformer attention (Child et al. 2019), the two factorised patterns in one head.

Child et al. split attention into two sub-patterns A1, A2 (over two heads or
two layers); here a query attends to their union A1 | A2 with ONE softmax
(their "merged head"). With s = `stride`, query i attends to key j (j not
padded) iff:

  'strided', causal:      0 <= i - j < s            (A1: the previous s positions,
                                                     i itself included)
                       or j <= i and (i - j) % s == 0   (A2: every s-th position back)
  'strided', non-causal:  |i - j| < s  or  (i - j) % s == 0
                       (both sub-patterns mirrored: the band on both sides, and
                        every s-th position before and after i)
  'fixed', causal:        j <= i and j // s == i // s   (A1: its own block of s)
                       or j <= i and j % s >= s - c      (A2: the last c =
                                                          `num_summary` positions
                                                          of every block)
  'fixed', non-causal:    j // s == i // s  or  j % s >= s - c
                       (its whole own block, and the summary positions of every
                        block, before and after)

Computation, blocked by s (n is padded up to a multiple of s with padded keys):
'strided' takes the band from `local.band_blocks` (the blocked band of
`local_attention`) plus, for query offset r inside its block, the column
{m s + r} of the sequence reshaped `[n / s, s]`; 'fixed' takes the own block
plus the n / s * c summary positions. One joint softmax over both segments
(`block_sparse.attend`); keys in both sub-patterns (i itself for 'strided', the
own block's summaries for 'fixed') are counted once. Cost per head: time
O(n (s + n / s) d) and memory O(n (s + n / s)) ('fixed': n / s becomes
c n / s); no n x n array. Shapes follow
`efficient_attn.mechanisms.base.Mechanism`.
"""

from typing import Optional

import jax.numpy as jnp
import numpy as np

from efficient_attn import registry
from efficient_attn.mechanisms import local
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import block_sparse
from efficient_attn.ops import masking
from efficient_attn.ops.scaled_dot_product import default_scale

PATTERNS = ('strided', 'fixed')


def _pad_to(x, length: int):
  pad = [(0, 0)] * x.ndim
  pad[1] = (0, length - x.shape[1])
  return jnp.pad(x, pad)


def sparse_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  *,
  pattern: str = 'strided',
  stride: int = 32,
  num_summary: int = 1,
  scale: Optional[float] = None,
):
  """Sparse Transformer attention, 'strided' or 'fixed' pattern (module docstring).

  Exact softmax attention restricted to the pattern. Scores and softmax run in
  float32 (or wider); the result has the dtype of `v`. Queries with no
  attendable key return 0. The mask is reduced to key padding with
  `masking.key_padding_from_mask`. Any length n works (padded internally to a
  multiple of `stride`).

  Args:
    q: `[batch, n, heads, head_dim]`.
    k: `[batch, n, heads, head_dim]`.
    v: `[batch, n, heads, v_dim]`.
    mask: optional bool key padding `[batch, n]` or flax-style mask; True = attend.
    causal: the causal patterns (j <= i).
    pattern: 'strided' or 'fixed'.
    stride: s >= 1, the band length and step ('strided') or block length ('fixed').
    num_summary: c, 1 <= c <= stride, summary positions per block ('fixed'
      only; ignored by 'strided').
    scale: score scale, default 1/sqrt(head_dim).

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`.

  Time O(n (s + n / s) d) and memory O(n (s + n / s)) per head (c n / s for
  'fixed').
  """
  masking.check_inputs(q, k, v, mask, name='sparse_attention', same_length=True)
  registry.check_arguments('sparse', 'sparse_attention', pattern=pattern, stride=stride)
  if pattern == 'fixed' and not 1 <= num_summary <= stride:
    raise ValueError(f'num_summary must be in [1, stride={stride}], got {num_summary}')
  b, n, h, d = q.shape
  scale = default_scale(d, scale)
  s = stride
  nb = -(-n // s)
  q, k, v = (_pad_to(x, nb * s) for x in (q, k, v))
  padding = _pad_to(block_sparse.key_padding(mask, b, n), nb * s)  # [b, N]
  query_block = np.arange(nb)[:, None]  # [c, 1]
  if pattern == 'strided':
    # A1: |i - j| <= s - 1 (causal: i - s < j <= i) is local attention's band.
    band = local.band_blocks(q, k, v, padding, 2 * s - 1 if not causal else s, causal, block_size=s)
    # A2: key m s + r for the query at offset r of block c; m == c is i itself (in A1).
    key_block = np.arange(nb)[None, :]  # [1, m]
    other = key_block < query_block if causal else key_block != query_block
    columns = block_sparse.to_blocks(padding, s).swapaxes(1, 2)  # [b, r, m]
    valid = other[None, :, None, None, :] & columns[:, None, None]  # [b, c, 1, r, m]
    strided = block_sparse.Segment(
      'row',
      block_sparse.to_blocks(k, s).swapaxes(1, 2),
      block_sparse.to_blocks(v, s).swapaxes(1, 2),
      valid,
    )
    queries, segments = band.queries, [band.segment, strided]
  else:
    # A1: the own block (causal: lower triangle).
    inside = np.tril(np.ones((s, s), bool)) if causal else np.ones((s, s), bool)
    own_valid = inside & block_sparse.to_blocks(padding, s)[:, :, None, None, :]
    own = block_sparse.Segment(
      'block', block_sparse.to_blocks(k, s), block_sparse.to_blocks(v, s), own_valid
    )
    # A2: the last num_summary positions of every other block (causal: earlier ones).
    positions = (np.arange(nb)[:, None] * s + np.arange(s - num_summary, s)).reshape(-1)
    key_block = positions[None, :] // s  # [1, nb * c]
    other = key_block < query_block if causal else key_block != query_block
    valid = other[None, :, None, None, :] & padding[:, None, None, None, positions]
    summary = block_sparse.Segment('shared', k[:, positions], v[:, positions], valid)
    queries, segments = block_sparse.to_blocks(q, s), [own, summary]
  out = block_sparse.attend(queries, segments, scale)
  out = out.reshape(b, nb * s, h, out.shape[-1])[:, :n]
  return out.astype(v.dtype)


@registry.register
class Sparse(registry.Mechanism):
  name = 'sparse'
  rotary = 'scores'
  description = 'Sparse Transformer strided / fixed patterns'
  citation = 'Child et al. 2019'
  options = (
    registry.Option('pattern', 'strided', str, 'the factorised pattern', choices=PATTERNS),
    registry.Option('stride', 32, int, 'stride / block length s', minimum=1),
    registry.Option('num_summary', 1, int, "'fixed': summary positions per block c", minimum=1),
    SCALE,
  )
  causal = True
  self_attention_only = True
  complexity = ('O(n (s + n / s) d)', 'O(n (s + n / s))')
  whole_sequence = 'its strided or summary keys reach across the whole sequence'
  no_segments = "its strided and summary keys are counted from the row's start, not each document's"
  knob = ('stride', (4, 8, 16, 32, 64))
  example = {'stride': 4}

  def exact_options(self, length):
    return {'stride': 1}

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return sparse_attention(
      q,
      k,
      v,
      mask=mask,
      causal=causal,
      pattern=options.pattern,
      stride=options.stride,
      num_summary=options.num_summary,
      scale=options.scale,
    )

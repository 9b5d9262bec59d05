"""BigBird block-sparse attention (Zaheer et al. 2020), ITC form.

The sequence of n tokens is cut into nb = n / B blocks of B = `block_size`
tokens. With G = `num_global_blocks` and R = `num_random_blocks`, query block
c attends to the key blocks of `bigbird_layout`:
  * global query blocks (c < G) attend to every key block;
  * every other block c attends to the sliding blocks c - 1, c, c + 1 (those
    that exist; no wrap-around), the G global blocks 0 .. G-1 (ITC: global
    tokens are the first tokens of the sequence), and R random key blocks drawn
    per (query block, head) from the blocks not already covered (fewer if fewer
    remain). The draws come from `numpy.random.default_rng(seed)`: fixed by
    (n, B, G, R, heads, seed, causal), never by the data.
Causal form: only key blocks <= c (sliding blocks c - 1 and c, random blocks
drawn from the past blocks G .. c - 2), and token-level j <= i inside the
diagonal block (global query rows: all j <= i).

A key selected by several patterns is counted once (the layout is a set of
blocks). When G + 3 + R >= nb every query block sees every block: the result
is exact (causal) softmax attention. Key padding is honoured.

The non-global query blocks gather their W <= G + 3 + R key blocks per head
through a static index table and take one masked softmax over them
(`block_sparse.attend`); the G global query blocks are computed densely.
Cost per head: time O(n (G + 3 + R) B d + G B n d), memory
O(n (G + 3 + R) B + G B n); no n x n array unless G ~ nb.
Shapes follow `efficient_attn.registry.Mechanism.attend`.
"""

from typing import Optional

import numpy as np

from efficient_attn import registry
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import block_sparse
from efficient_attn.ops import masking
from efficient_attn.ops.scaled_dot_product import default_scale


def bigbird_layout(
  num_blocks: int,
  heads: int,
  num_global_blocks: int = 1,
  num_random_blocks: int = 1,
  seed: int = 0,
  causal: bool = False,
) -> np.ndarray:
  """The block-level BigBird pattern (see the module docstring).

  Args:
    num_blocks: nb, the number of blocks of the sequence.
    heads: number of heads (random blocks are drawn per head).
    num_global_blocks: G, 0 <= G <= nb.
    num_random_blocks: R >= 0, per (query block, head).
    seed: seed of the numpy Generator drawing the random blocks.
    causal: the causal pattern (key blocks <= query block).

  Returns:
    Bool numpy `[heads, num_blocks, num_blocks]`: entry (h, c, m) is True iff
    query block c attends to key block m in head h. In the causal form the
    diagonal block still needs the token-level mask j <= i.
  """
  rng = np.random.default_rng(seed)
  nb, g = num_blocks, num_global_blocks
  layout = np.zeros((heads, nb, nb), bool)
  layout[:, :g, :] = True
  layout[:, :, :g] = True
  for c in range(g, nb):
    layout[:, c, max(c - 1, 0) : (c + 1 if causal else min(c + 2, nb))] = True
    for head in range(heads):
      candidates = np.flatnonzero(~layout[head, c, : (c if causal else nb)])
      size = min(num_random_blocks, candidates.size)
      if size:
        layout[head, c, rng.choice(candidates, size=size, replace=False)] = True
  if causal:
    layout &= np.tril(np.ones((nb, nb), bool))
  return layout


def _key_table(layout: np.ndarray, first: int, block: int):
  """Static gather table of the query blocks `first ..` from a block layout.

  Returns (index, entry_valid): int `[num_rows, heads, W * block]` token
  positions of the selected key blocks, W = the most blocks of any row, and
  bool of the same shape, False for filler entries (rows with fewer blocks).
  """
  heads, nb, _ = layout.shape
  rows = layout[:, first:].transpose(1, 0, 2)  # [rows, heads, nb]
  width = int(rows.sum(-1).max())
  # Selected blocks first (stable), then filler: a fixed-width index per row.
  order = np.argsort(~rows, axis=-1, kind='stable')[..., :width]
  entry_valid = np.take_along_axis(rows, order, axis=-1)
  index = order[..., None] * block + np.arange(block)  # [rows, heads, W, B]
  entry_valid = np.broadcast_to(entry_valid[..., None], index.shape)
  shape = (nb - first, heads, width * block)
  return index.reshape(shape), entry_valid.reshape(shape)


def bigbird_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  *,
  block_size: int = 64,
  num_global_blocks: int = 1,
  num_random_blocks: int = 1,
  seed: int = 0,
  scale: Optional[float] = None,
):
  """BigBird ITC attention: sliding, global and random key blocks.

  Exact softmax attention restricted to the `bigbird_layout` pattern (module
  docstring). Scores and softmax run in float32 (or wider); the result has the
  dtype of `v`. Queries with no attendable key return 0. The mask is reduced
  to key padding with `masking.key_padding_from_mask`.

  Args:
    q: `[batch, n, heads, head_dim]`.
    k: `[batch, n, heads, head_dim]`.
    v: `[batch, n, heads, v_dim]`.
    mask: optional bool key padding `[batch, n]` or flax-style mask; True = attend.
    causal: query i sees keys j <= i only.
    block_size: B >= 1, must divide n.
    num_global_blocks: G, 0 <= G <= n / B.
    num_random_blocks: R >= 0 random key blocks per (query block, head).
    seed: seed of the random block choice (static).
    scale: score scale, default 1/sqrt(head_dim).

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`.

  Time O(n (G + 3 + R) B d) and memory O(n (G + 3 + R) B) per head.
  """
  masking.check_inputs(q, k, v, mask, name='bigbird_attention', same_length=True)
  b, n, h, d = q.shape
  registry.check_arguments(
    'bigbird',
    'bigbird_attention',
    block_size=block_size,
    num_global_blocks=num_global_blocks,
    num_random_blocks=num_random_blocks,
  )
  if n % block_size:
    raise ValueError(
      f'sequence length {n} is not divisible by block_size {block_size}; '
      f'block_size must divide the length'
    )
  nb = n // block_size
  if num_global_blocks > nb:
    raise ValueError(
      f'num_global_blocks must be in [0, {nb}] (the number of blocks, '
      f'length {n} / block_size {block_size}), got {num_global_blocks}'
    )
  scale = default_scale(d, scale)
  padding = block_sparse.key_padding(mask, b, n)
  g = num_global_blocks * block_size

  def other_rows():
    layout = bigbird_layout(nb, h, num_global_blocks, num_random_blocks, seed, causal)
    index, entry_valid = _key_table(layout, num_global_blocks, block_size)  # [c, h, t]
    valid = entry_valid[:, :, None, :]  # [c, h, 1, t]
    if causal:
      qpos = g + np.arange(n - g).reshape(-1, 1, block_size, 1)  # [c, 1, B, 1]
      valid = valid & (index[:, :, None, :] <= qpos)
    valid = valid[None] & padding[:, index][:, :, :, None, :]  # [b, c, h, B, t]
    segment = block_sparse.Segment(
      'block', block_sparse.gather(k, index), block_sparse.gather(v, index), valid
    )
    queries = block_sparse.to_blocks(q[:, g:], block_size)
    out = block_sparse.attend(queries, [segment], scale)
    return out.reshape(b, n - g, h, out.shape[-1])

  return block_sparse.global_rows_first(q, k, v, padding, causal, scale, g, other_rows)


@registry.register
class BigBird(registry.Mechanism):
  name = 'bigbird'
  rotary = 'scores'
  description = 'block-sparse: sliding, global and random blocks (ITC)'
  citation = 'Zaheer et al. 2020'
  options = (
    registry.Option(
      'block_size', 64, int, 'tokens per block B (must divide the length)', minimum=1
    ),
    registry.Option('num_global_blocks', 1, int, 'global blocks G (the first ones)', minimum=0),
    registry.Option('num_random_blocks', 1, int, 'random key blocks R per query block', minimum=0),
    registry.Option('seed', 0, int, 'seed of the random block choice', minimum=0),
    SCALE,
  )
  causal = True
  self_attention_only = True
  complexity = ('O(n (G + R + 3) B d)', 'O(n (G + R + 3) B)')
  whole_sequence = 'its global and random key blocks reach across the whole sequence'
  no_segments = 'its global and random key blocks span documents'
  knob = ('num_random_blocks', (0, 1, 2, 4, 8))
  example = {'block_size': 2}

  def check(self, options, *, length, max_length, causal):
    if length % options.block_size:
      raise ValueError(
        f"option block_size={options.block_size} of mechanism 'bigbird' does not "
        f'divide the sequence length {length}; valid: a divisor of {length}'
      )
    if options.num_global_blocks > length // options.block_size:
      raise ValueError(
        f"option num_global_blocks={options.num_global_blocks} of mechanism "
        f"'bigbird' exceeds the {length // options.block_size} blocks of length "
        f'{length} (block_size={options.block_size})'
      )

  def exact_options(self, length):
    block = next(b for b in (16, 8, 4, 2, 1) if length % b == 0)
    return {'block_size': block, 'num_global_blocks': length // block}

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return bigbird_attention(
      q,
      k,
      v,
      mask=mask,
      causal=causal,
      block_size=options.block_size,
      num_global_blocks=options.num_global_blocks,
      num_random_blocks=options.num_random_blocks,
      seed=options.seed,
      scale=options.scale,
    )

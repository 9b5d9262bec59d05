"""Shared core of the block-sparse mechanisms: local, Longformer, BigBird, Sparse.

Queries are cut into blocks `[batch, num_blocks, block, heads, head_dim]`. Each
query attends to the keys of one or more *segments*, and ONE softmax runs over
the concatenation of its segments, so a query's weights sum to 1 over all the
keys it sees. A key reachable through two segments must be valid in only one
of them (each key is counted once per query). A segment holds its keys and
values in one of three layouts:

  * 'block': `[batch, num_blocks, t, heads, dim]`, the t keys of each query
    block (a band of neighbouring blocks, or blocks gathered by an index table);
  * 'shared': `[batch, t, heads, dim]`, the same t keys for every query (global
    tokens, summary positions);
  * 'row': `[batch, block, t, heads, dim]`, the same t keys for the query at a
    given offset of every block (the strided columns of the Sparse Transformer).

and a bool `valid` broadcastable to `[batch, num_blocks, heads, block, t]`.
Scores, softmax and the weighted sum run in float32 or wider; queries with no
valid key return 0. A segment of t keys costs O(n t d) time and O(n t) memory
per head (n = num_blocks * block queries): no n x n array is formed unless a
segment itself has t = n keys (global query rows).
"""

import functools
import operator
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from efficient_attn.ops import masking

LAYOUTS = ('block', 'shared', 'row')
_SCORES = {
  'block': 'bcqhd,bckhd->bchqk',
  'shared': 'bcqhd,bkhd->bchqk',
  'row': 'bcqhd,bqkhd->bchqk',
}
_VALUES = {
  'block': 'bchqk,bckhd->bcqhd',
  'shared': 'bchqk,bkhd->bcqhd',
  'row': 'bchqk,bqkhd->bcqhd',
}


class Segment(NamedTuple):
  """Keys, values and validity of one group of keys (see the module docstring).

  Attributes:
    layout: 'block', 'shared' or 'row'.
    keys: keys in that layout, last two axes `[heads, head_dim]`.
    values: values in that layout, last two axes `[heads, v_dim]`.
    valid: bool broadcastable to `[batch, num_blocks, heads, block, t]`.
  """

  layout: str
  keys: jnp.ndarray
  values: jnp.ndarray
  valid: jax.typing.ArrayLike  # a NumPy constant (a fixed pattern) or a traced array


def compute_dtype(*arrays) -> jnp.dtype:
  """The common dtype of `arrays`, at least float32."""
  out = jnp.float32
  for x in arrays:
    out = jnp.promote_types(out, x.dtype)
  return out


def key_padding(mask, batch: int, length: int) -> jnp.ndarray:
  """Bool key padding `[batch, length]` from an optional mask (all True if None)."""
  padding = masking.key_padding_from_mask(mask, batch, length)
  return jnp.ones((batch, length), bool) if padding is None else padding


def to_blocks(x, block: int) -> jnp.ndarray:
  """`[batch, n, ...]` -> `[batch, n // block, block, ...]` (block must divide n)."""
  return x.reshape((x.shape[0], x.shape[1] // block, block) + x.shape[2:])


def gather(x, index) -> jnp.ndarray:
  """Rows of `x` `[batch, n, heads, dim]` picked by a static integer table.

  Args:
    x: `[batch, n, heads, dim]`.
    index: int `[num_blocks, t]` (the same rows for every head) or
      `[num_blocks, heads, t]` (rows per head), entries in [0, n).

  Returns:
    `[batch, num_blocks, t, heads, dim]` (the 'block' layout).
  """
  index = np.asarray(index)
  if index.ndim == 2:
    return x[:, index]
  heads = np.arange(x.shape[2])[None, None, :]
  return x[:, np.swapaxes(index, 1, 2), heads]


def attend(queries, segments: Sequence[Segment], scale: float) -> jnp.ndarray:
  """One joint masked softmax of query blocks over several key segments.

  Args:
    queries: `[batch, num_blocks, block, heads, head_dim]`.
    segments: `Segment`s whose keys the queries attend to.
    scale: score scale.

  Returns:
    `[batch, num_blocks, block, heads, v_dim]` in float32 or wider (the common
    dtype of the inputs); 0 for queries without any valid key.

  Time O(n t d) and memory O(n t) per head, t = total keys of the segments.
  """
  arrays = [queries] + [x for seg in segments for x in (seg.keys, seg.values)]
  compute = compute_dtype(*arrays)
  neg = masking.big_neg(compute)
  q = queries.astype(compute)
  scores, valids = [], []
  for seg in segments:
    if seg.layout not in LAYOUTS:
      raise ValueError(f'segment layout must be one of {LAYOUTS}, got {seg.layout!r}')
    s = jnp.einsum(_SCORES[seg.layout], q, seg.keys.astype(compute)) * scale
    valid = jnp.broadcast_to(seg.valid, s.shape)
    scores.append(jnp.where(valid, s, neg))
    valids.append(valid)
  s = jnp.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0]
  valid = jnp.concatenate(valids, axis=-1) if len(valids) > 1 else valids[0]
  w = jax.nn.softmax(s, axis=-1)
  w = jnp.where(valid, w, 0.0)
  parts, start = [], 0
  for seg, part in zip(segments, scores):
    stop = start + part.shape[-1]
    parts.append(jnp.einsum(_VALUES[seg.layout], w[..., start:stop], seg.values.astype(compute)))
    start = stop
  return functools.reduce(operator.add, parts)


def attend_all_keys(q, k, v, padding, causal: bool, scale: float) -> jnp.ndarray:
  """Global query rows: queries at positions 0 .. g-1 attend to every key.

  Used for the global tokens of Longformer and the global blocks of BigBird.
  Time O(g n d) and memory O(g n) per head.

  Args:
    q: `[batch, g, heads, head_dim]`, the queries at positions 0 .. g-1.
    k: `[batch, n, heads, head_dim]`.
    v: `[batch, n, heads, v_dim]`.
    padding: bool key padding `[batch, n]`.
    causal: query i sees keys j <= i only.
    scale: score scale.

  Returns:
    `[batch, g, heads, v_dim]` in float32 or wider.
  """
  g, n = q.shape[1], k.shape[1]
  valid = padding[:, None, None, None, :]
  if causal:
    valid = valid & (np.arange(n)[None, :] <= np.arange(g)[:, None])
  return attend(q[:, None], [Segment('shared', k, v, valid)], scale)[:, 0]


def global_rows_first(
  q,
  k,
  v,
  padding,
  causal: bool,
  scale: float,
  num_global: int,
  other_rows: Callable[[], jnp.ndarray],
) -> jnp.ndarray:
  """The output of global query rows 0 .. g-1 (`attend_all_keys`), then of the others.

  The tail shared by Longformer (global tokens) and BigBird (global blocks).

  Args:
    q: `[batch, n, heads, head_dim]`.
    k: `[batch, n, heads, head_dim]`.
    v: `[batch, n, heads, v_dim]`.
    padding: bool key padding `[batch, n]`.
    causal: query i sees keys j <= i only.
    scale: score scale.
    num_global: g, 0 <= g <= n.
    other_rows: called only when g < n; returns the output of rows g .. n-1,
      `[batch, n - g, heads, v_dim]`.

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`.
  """
  parts = []
  if num_global:
    parts.append(attend_all_keys(q[:, :num_global], k, v, padding, causal, scale))
  if num_global < q.shape[1]:
    parts.append(other_rows())
  out = jnp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
  return out.astype(v.dtype)

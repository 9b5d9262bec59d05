"""Packed rows in the recurrences' forms: the documents of `segment_ids`, their masks per
chunk, and the documents that cross the devices of a split sequence.

Shared by the decay recurrence (`efficient_attn.ops.gated`), the delta rule
(`efficient_attn.ops.delta`) and the short convolution (`efficient_attn.ops.short_conv`).
What a segment id means is `efficient_attn.ops.segments` (docs/design.md, "Documents"): a
document is a run of equal non-zero ids, 0 is padding, and every form reads the document
index. A reset is a mask:

  * a padding token writes nothing (`zero_padding`: its inputs are 0, by `where`, so a NaN
    there reaches nothing);
  * within a chunk, token t reads token s only where both are of one document (`same`);
  * the state carried into a chunk reaches its tokens of the document it came from
    (`enter`), and leaves the chunk only if the chunk's last token is of that document
    (`passes`); the chunk's end state gathers the tokens of its last document (`leave`);
  * on a sequence split over devices, the state arriving from the devices before reaches
    a block's first document only if that document continues theirs (`continues`).

Shapes: segment ids, document indices and masks `[batch, length]`; per chunk `[n_chunks,
batch, c]`, and the masks of one chunk `[batch, 1, c, c]` or `[batch, 1, c, 1]` (over the
heads axis of the forms' `[batch, heads, c, ...]` arrays).
"""

from typing import NamedTuple, Optional

import jax.numpy as jnp

from efficient_attn.ops import collectives
from efficient_attn.ops import segments


class Packed(NamedTuple):
  """The documents of a packed row: `documents` `[batch, length]` int32
  (`segments.document_index`) and `real` `[batch, length]` bool (not padding)."""

  documents: jnp.ndarray
  real: jnp.ndarray


def packed(segment_ids, batch: int, length: int, name: str) -> Optional[Packed]:
  """The `Packed` documents of `segment_ids` `[batch, length]` (None: None, one document a
  row), checked (`segments.check`: a one-line ValueError naming `name`)."""
  if segment_ids is None:
    return None
  ids = segments.check(segment_ids, batch, length, name)
  return Packed(segments.document_index(ids), ids != 0)


def as_segment_ids(documents, key_padding):
  """Segment ids `[batch, length]` whose documents are `documents` (a document index, e.g. a
  layer's `ctx.documents`) and whose padding is `key_padding` (True: a real token; None:
  none); None where both are None."""
  if documents is None:
    return None if key_padding is None else jnp.asarray(key_padding, jnp.int32)
  ids = jnp.asarray(documents, jnp.int32) + 1
  return ids if key_padding is None else jnp.where(key_padding, ids, 0)


def zero_padding(real, *xs):
  """Each `[batch, length, ...]` array of xs (None passes) with its padded tokens (`real`
  False) set to 0 by `where`, so whatever they held reaches nothing, gradients included."""
  if real is None:
    return xs
  return tuple(
    None if x is None else jnp.where(real.reshape(real.shape + (1,) * (x.ndim - 2)), x, 0)
    for x in xs
  )


def resets(documents):
  """`[batch, length]` bool: token t is of another document than token t - 1 (never at t =
  0, where the initial state's document is the row's first)."""
  previous = jnp.concatenate([documents[:, :1], documents[:, :-1]], axis=1)
  return documents != previous


def chunk_documents(documents, c: int):
  """(documents `[n_chunks, batch, c]`, doc_in `[n_chunks, batch]`): the document index cut
  into chunks of c (the last padded with the row's last document), and the document of the
  token before each chunk (the row's first document before the first chunk)."""
  b, n = documents.shape
  nc = -(-n // c)
  padded = jnp.pad(documents, [(0, 0), (0, nc * c - n)], mode='edge')
  chunks = jnp.moveaxis(padded.reshape(b, nc, c), 1, 0)
  doc_in = jnp.concatenate([chunks[:1, :, 0], chunks[:-1, :, -1]], axis=0)
  return chunks, doc_in


class ChunkMasks(NamedTuple):
  """The masks of one chunk (module docstring), over `[batch, heads, c, ...]` arrays:
  same `[b, 1, c, c]` (query t, key s of one document), enter `[b, 1, c, 1]` (token t of
  the carried state's document), leave `[b, 1, c, 1]` (token s of the chunk's last
  document), passes `[b, 1, 1, 1]` (the chunk's last token is of the carried state's
  document)."""

  same: jnp.ndarray
  enter: jnp.ndarray
  leave: jnp.ndarray
  passes: jnp.ndarray


def chunk_masks(docs, doc_in) -> ChunkMasks:
  """`ChunkMasks` of a chunk's documents `[b, c]` and the carried state's `doc_in` `[b]`."""
  column = lambda x: x[:, None, :, None]
  return ChunkMasks(
    same=(docs[:, :, None] == docs[:, None, :])[:, None],
    enter=column(docs == doc_in[:, None]),
    leave=column(docs == docs[:, -1:]),
    passes=(docs[:, -1] == doc_in)[:, None, None, None],
  )


def mask_chunk(dx, scores, q_in, k_out, s):
  """One chunk's (scores, q_in, k_out, S_0) confined to its documents; as given where dx
  is None (one document a row). dx: (documents `[b, c]`, doc_in `[b]`), a chunk of
  `chunk_documents`; scores `[b, h, c, c]` to one document (`same`), q_in `[b, h, c, dk]`
  (the reads of the carried state S_0) to S_0's document (`enter`), k_out (the writes to
  the chunk's end state) to the chunk's last document (`leave`), and S_0 `[b, h, dk, dv]`
  reaches the chunk's end only if that is S_0's document (`passes`)."""
  if dx is None:
    return scores, q_in, k_out, s
  masks = chunk_masks(*dx)
  return (
    jnp.where(masks.same, scores, 0.0),
    jnp.where(masks.enter, q_in, 0.0),
    jnp.where(masks.leave, k_out, 0.0),
    jnp.where(masks.passes, s, 0.0),
  )


def token_documents(documents, segment, name: str):
  """A decoding step's documents: (real, reset, segment after the token), each `[batch]`.

  `documents` `[batch, 1]`: the token's raw segment id (0: padding); `segment` `[batch]`
  (None: zeros): the state's id of its last real token (0: none yet). A real token whose
  id differs from `segment` (when that is not 0) starts a new document (`reset`); a
  padding token (`real` False) leaves `segment` as it was. A one-line ValueError naming
  `name` for ids of another shape."""
  batch = documents.shape[0]
  ids = segments.check(documents, batch, 1, name)[:, 0]
  segment = jnp.zeros((batch,), jnp.int32) if segment is None else segment
  real = ids != 0
  reset = real & (segment != 0) & (ids != segment)
  return real, reset, jnp.where(real, ids, segment)


def where_rows(mask, x, otherwise=0):
  """x `[b, ...]` where mask `[b]` is True, else `otherwise`."""
  return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, otherwise)


# A sequence split over the devices of a mesh axis (inside `jax.shard_map`): each device
# holds a block of the row's segment ids, and a document may cross its block's edges.


def _first_and_last_id(segment_ids):
  """(first, last) real id of each row `[b]` of a block (0 where it has none)."""
  ids = jnp.asarray(segment_ids, jnp.int32)
  n = ids.shape[1]
  index = jnp.arange(n)
  real = ids != 0
  first = jnp.min(jnp.where(real, index, n - 1), axis=1)
  last = jnp.max(jnp.where(real, index, 0), axis=1)
  take = lambda at: jnp.take_along_axis(ids, at[:, None], axis=1)[:, 0]
  return take(first), take(last)


def continues(segment_ids, axis: str):
  """`[b]` bool: this block's first document is the one its row's last real token on the
  devices before was in (the state arriving from them reaches it), or the block holds no
  real token (the state passes through it). Found by an exclusive scan of the blocks' last
  real ids over `axis`."""
  first, last = _first_and_last_id(segment_ids)
  latest = lambda earlier, later: jnp.where(later != 0, later, earlier)
  before = collectives.exclusive_scan(latest, last, jnp.zeros_like(last), axis)
  return (first == before) | (first == 0)

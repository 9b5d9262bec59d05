"""Packing documents into fixed-length rows, with segment ids (0 is padding).

    rows = packing.best_fit([700, 30, 250, 256], row_length=256)   # [[0], [3], [2], [1]]
    inputs, labels, segment_ids = packing.pack(documents, row_length=256)
    for row, start, end in packing.spans(segment_ids): ...         # each packed document

A language model's corpus has documents of every length; padding each to the row length
wastes a third to a half of the compute (48% for the byte LM's default corpus at 256
bytes). Packing puts several documents in one row and marks them with `segment_ids`
`[rows, row_length]` int32: 1, 2, 3, ... for the row's documents in order, 0 for the
padding after them (the convention of splash attention and MaxText; what a segment id
means is in `efficient_attn/ops/segments.py`). A model that honours segment ids reads
each document as if it were alone, with positions restarting at 0 in each
(`segments.positions`).

A document here is a pair of int arrays of one length: the model's inputs and the
labels they are scored with (-100: not scored; the sequence-labelling format of
`sequences.py`). Its labels belong to its own tokens, so no token is ever scored on
another document's text. A document longer than the row is refused: cut it first (the
byte LM cuts a document into windows, `text_bytes.pieces`).

The rows are **best-fit decreasing** (a greedy bin packing): the documents, longest first
(ties in their given order), each go into the open row with the least room that holds
them, or open a new row. Deterministic: the same documents give the same rows, so a
resumed run packs the same way. Rows are listed in the order they were opened.
"""

import bisect
from typing import Iterator, List, Sequence, Tuple

import numpy as np

IGNORE = -100  # an unscored label (`sequences.IGNORE`)


def best_fit(lengths: Sequence[int], row_length: int) -> List[List[int]]:
  """The documents of each row, as indices into `lengths` in the order they were placed.

  `lengths` are positive, at most `row_length` (ValueError naming the first that is not).
  """
  lengths = [int(n) for n in lengths]
  for i, n in enumerate(lengths):
    if not 1 <= n <= row_length:
      raise ValueError(
        f'document {i} has {n} tokens; packing into rows of {row_length} takes '
        f'documents of 1..{row_length} tokens (cut longer ones first)'
      )
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties in order
  rows: List[List[int]] = []
  room: List[Tuple[int, int]] = []  # (tokens left, row) of the rows with room, sorted
  for i in order:
    n = lengths[i]
    at = bisect.bisect_left(room, (n, -1))  # the least room that holds n
    if at < len(room):
      left, row = room.pop(at)
    else:
      left, row = row_length, len(rows)
      rows.append([])
    rows[row].append(i)
    if left > n:
      bisect.insort(room, (left - n, row))
  return rows


def pack(
  documents: Sequence[Tuple[np.ndarray, np.ndarray]], row_length: int
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(inputs, labels, segment_ids) int32 `[rows, row_length]` of `documents` (pairs of
  inputs and labels, each `[length]`) packed by `best_fit`: padding is input 0, label
  -100 (not scored) and segment 0."""
  for i, (x, y) in enumerate(documents):
    if np.shape(x) != np.shape(y) or np.ndim(x) != 1:
      raise ValueError(
        f'document {i}: inputs {list(np.shape(x))} and labels {list(np.shape(y))} must '
        f'be one [length] each'
      )
  rows = best_fit([len(x) for x, _ in documents], row_length)
  inputs = np.zeros((len(rows), row_length), np.int32)
  labels = np.full((len(rows), row_length), IGNORE, np.int32)
  segment_ids = np.zeros((len(rows), row_length), np.int32)
  for r, members in enumerate(rows):
    at = 0
    for segment, i in enumerate(members, 1):
      x, y = documents[i]
      inputs[r, at : at + len(x)] = x
      labels[r, at : at + len(x)] = y
      segment_ids[r, at : at + len(x)] = segment
      at += len(x)
  return inputs, labels, segment_ids


def spans(segment_ids: np.ndarray) -> Iterator[Tuple[int, int, int]]:
  """(row, start, end) of every document of `segment_ids` `[rows, length]` (a run of one
  non-zero id), row by row, left to right; `end` is exclusive."""
  ids = np.asarray(segment_ids)
  for r, row in enumerate(ids):
    edges = np.flatnonzero(np.diff(row, prepend=0, append=0))  # where the id changes
    for start, end in zip(edges[:-1], edges[1:]):
      if row[start]:
        yield r, int(start), int(end)


def fill(segment_ids: np.ndarray) -> float:
  """The fraction of the rows' tokens that are real (not padding)."""
  ids = np.asarray(segment_ids)
  return float((ids != 0).mean()) if ids.size else 0.0

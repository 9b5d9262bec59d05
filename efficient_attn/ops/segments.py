"""Packed sequences: segment ids, the documents they mark, and the masks every form reads.

A row `[length]` of `segment_ids` (int; 0 is padding, as in splash attention and MaxText)
packs several documents. A **document is a run** of equal non-zero ids. Every mechanism
reads the *document index* (`document_index`), never the raw ids, so an id may be reused
by a later run and a padding gap inside a row changes nothing:

    segment_ids     [1, 1, 1, 2, 2, 0, 2, 7, 0, 0]
    document_index  [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    is_real         [T, T, T, T, T, F, T, T, F, F]

Padding takes the index of the real token before it (index 0 before any), and the index
steps by one wherever a real token's id differs from the previous real token's. Then:

  * token t reads token s only if s <= t (causal) and both are real and of one document;
  * a padding token writes nothing and its output is 0;
  * an initial state belongs to the row's first document (it reaches t where
    documents[t] == documents[0]); the final state is the last real token's document's.

Shapes: ids and indices `[batch, length]`; masks `[batch, length, length]` or per chunk.
"""

from typing import Optional

from jax import lax
import jax.numpy as jnp


def is_real(segment_ids):
  """The tokens that are not padding: `segment_ids != 0`, `[batch, length]` bool."""
  return jnp.asarray(segment_ids) != 0


def document_starts(segment_ids):
  """`[batch, length]` bool: the real tokens that begin a document (whose id differs from
  the previous real token's, or that have no real token before them)."""
  ids = jnp.asarray(segment_ids).astype(jnp.int32)
  real = ids != 0
  # The id of the last real token before each position (0 where there is none).
  index = jnp.arange(ids.shape[-1])
  last = lax.cummax(jnp.where(real, index, -1), axis=ids.ndim - 1)
  last_id = jnp.where(last >= 0, jnp.take_along_axis(ids, jnp.maximum(last, 0), -1), 0)
  previous = jnp.concatenate([jnp.zeros_like(last_id[..., :1]), last_id[..., :-1]], -1)
  return real & (ids != previous)


def document_index(segment_ids):
  """The document of each token, `[batch, length]` int32 (see the module docstring): the
  row's first document (and any padding before it) is 0."""
  starts = document_starts(segment_ids)
  return jnp.maximum(jnp.cumsum(starts, axis=-1, dtype=jnp.int32) - 1, 0)


def same_document(documents_q, documents_k):
  """`[batch, q, k]` bool: query and key tokens of one document (indices from
  `document_index`)."""
  return documents_q[..., :, None] == documents_k[..., None, :]


def attention_mask(segment_ids, *, causal: bool):
  """The `[batch, 1, length, length]` bool mask of a packed row: one document, both tokens
  real, and s <= t if causal (the dense reference every form must equal)."""
  documents = document_index(segment_ids)
  real = is_real(segment_ids)
  mask = same_document(documents, documents) & real[..., :, None] & real[..., None, :]
  if causal:
    n = documents.shape[-1]
    mask = mask & jnp.tril(jnp.ones((n, n), bool))
  return mask[:, None]


def positions(segment_ids, start: Optional[jnp.ndarray] = None):
  """Each token's position within its document, `[batch, length]` int32 (0 at a document's
  first token; padding keeps counting from the token before it). `start` `[batch]`: the
  first document's position at the row's first token (a row that continues a document)."""
  documents = document_index(segment_ids)
  n = documents.shape[-1]
  index = jnp.arange(n, dtype=jnp.int32)
  first = document_starts(segment_ids) | (index == 0)
  begun = lax.cummax(jnp.where(first, index, 0), axis=documents.ndim - 1)
  out = index - begun
  if start is not None:
    out = out + jnp.where(documents == 0, jnp.asarray(start, jnp.int32)[..., None], 0)
  return out


def check(segment_ids, batch: int, length: int, name: str):
  """`segment_ids` as an int32 `[batch, length]` array, else a one-line ValueError naming
  `name` (the function or layer) and the shape or dtype it got."""
  ids = jnp.asarray(segment_ids)
  if ids.shape != (batch, length):
    raise ValueError(
      f'{name}: segment_ids of shape {tuple(ids.shape)} does not fit the inputs; '
      f'valid: [batch, length] = {[batch, length]}'
    )
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(
      f'{name}: segment_ids of dtype {ids.dtype}; valid: an integer dtype (0 is padding)'
    )
  return ids.astype(jnp.int32)

"""Packed sequences' documents (efficient_attn.ops.segments) against a loop over the row."""

import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.ops import segments


def _reference(ids):
  """(document index, positions) of one row, token by token, as the docstring defines."""
  documents, positions = [], []
  document, last_real, position = -1, 0, -1
  for t, i in enumerate(ids):
    if i != 0 and i != last_real:
      document, position = document + 1, 0
    else:
      position += 1
    if i != 0:
      last_real = i
    documents.append(max(document, 0))
    positions.append(position if t else 0)
  return documents, positions


ROWS = [
  [1, 1, 1, 2, 2, 0, 2, 7, 0, 0],  # a padding gap inside a document, trailing padding
  [0, 0, 3, 3, 0, 1, 1, 1, 1, 0],  # leading padding
  [5, 5, 6, 5, 5, 5, 6, 6, 6, 6],  # ids reused by later runs
  [0] * 10,
  [4] * 10,
]


@pytest.mark.parametrize('row', ROWS)
def test_documents_and_positions_follow_the_definition(row):
  documents, positions = _reference(row)
  ids = jnp.asarray([row])
  np.testing.assert_array_equal(segments.document_index(ids)[0], documents)
  np.testing.assert_array_equal(segments.positions(ids)[0], positions)


def test_the_mask_is_one_document_of_real_tokens():
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, 3, (4, 12)))
  mask = np.asarray(segments.attention_mask(ids, causal=True))[:, 0]
  documents = np.asarray(segments.document_index(ids))
  real = np.asarray(ids) != 0
  for b in range(4):
    for t in range(12):
      for s in range(12):
        want = s <= t and real[b, s] and real[b, t] and documents[b, s] == documents[b, t]
        assert mask[b, t, s] == want, (b, t, s)
  both = np.asarray(segments.attention_mask(ids, causal=False))[:, 0]
  assert (both == both.transpose(0, 2, 1)).all() and (both[mask]).all()


def test_a_continued_row_starts_at_its_position():
  ids = jnp.asarray([[1, 1, 2, 2]])
  np.testing.assert_array_equal(segments.positions(ids, start=jnp.asarray([7]))[0], [7, 8, 0, 1])


def test_bad_segment_ids_are_one_line():
  with pytest.raises(ValueError, match=r'f: segment_ids of shape \(2, 3\) does not fit'):
    segments.check(jnp.zeros((2, 3), int), 2, 4, 'f')
  with pytest.raises(ValueError, match='f: segment_ids of dtype float32; valid: an integer'):
    segments.check(jnp.zeros((2, 4)), 2, 4, 'f')

"""Packed rows (data/packing.py) and what the tasks count on them (train/tasks).

The packer: every document exactly once, rows within their length, best fit, the same
rows every time. The byte LM's packed rows are its windows, each scored once on its own
bytes. The loss and metrics: a model that reads each document alone scores a packed batch
exactly as the same windows unpacked (sums of loss, accuracy, count; 'tokens' counts the
real ones), and a model that reads across documents does not, so the comparison can fail.
The model is a small stand-in with the packed interface (`apply(..., segment_ids=,
positions=, logits_at=)`); the layers' own property test checks the real ones.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data import packing
from data import sequences
from data import text_bytes
from efficient_attn.ops import segments
from train.tasks import byte_lm
from train.tasks import sequence_labelling


def test_best_fit_places_every_document_once_within_its_row():
  lengths = np.random.default_rng(0).integers(1, 33, size=200).tolist() + [32, 1, 1]
  rows = packing.best_fit(lengths, 32)
  assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
  assert all(sum(lengths[i] for i in row) <= 32 for row in rows)
  assert rows == packing.best_fit(lengths, 32)  # deterministic: a resumed run packs the same
  # near the bound: at most one row in the packing is less than half full (best fit)
  assert sum(sum(lengths[i] for i in row) <= 16 for row in rows) <= 1
  # within best-fit decreasing's bound of 11/9 of the fewest rows possible, plus one
  fewest = max(-(-sum(lengths) // 32), sum(n > 16 for n in lengths))  # a lower bound
  assert len(rows) <= 11 / 9 * fewest + 1


def test_best_fit_takes_the_row_with_the_least_room_that_holds_a_document():
  # decreasing: 6 opens row 0 (room 4), 5 opens row 1 (room 5), 4 fits both: row 0 is the
  # tighter; 3 then goes to row 1 (room 5), 2 to row 1 (room 2); 1 fits none: a new row
  assert packing.best_fit([1, 4, 6, 3, 5, 2], 10) == [[2, 1], [4, 3, 5], [0]]


@pytest.mark.parametrize('length', [0, 11])
def test_a_document_that_cannot_be_packed_is_one_line(length):
  with pytest.raises(ValueError, match=f'document 1 has {length} tokens; packing into rows of 10'):
    packing.best_fit([3, length], 10)


def test_pack_writes_each_document_with_its_segment_and_padding_after():
  docs = [(np.arange(n) + 10 * i, np.arange(n) + 100 * i) for i, n in enumerate([4, 2, 5, 3])]
  inputs, labels, segment_ids = packing.pack(docs, 6)
  assert inputs.shape == labels.shape == segment_ids.shape == (3, 6)
  found = [
    (inputs[r, a:b].tolist(), labels[r, a:b].tolist()) for r, a, b in packing.spans(segment_ids)
  ]
  assert sorted(found) == sorted((x.tolist(), y.tolist()) for x, y in docs)
  for row in segment_ids:  # 1, 2, ... in order, then padding
    real = row[row != 0]
    assert (np.diff(real) >= 0).all() and real[0] == 1 and (row[len(real) :] == 0).all()
  assert (inputs[segment_ids == 0] == 0).all() and (labels[segment_ids == 0] == -100).all()
  assert packing.fill(segment_ids) == 14 / 18


CORPUS = [b'The first document, long enough for two windows.', b'Short.', b'x', b'Third one here.']
L = 16


def test_packed_byte_windows_are_the_windows_each_scored_once_on_its_own_bytes():
  inputs, labels, segment_ids = text_bytes.packed(CORPUS, L)
  windows = [(x.tolist(), y.tolist()) for doc in CORPUS for x, y in text_bytes.pieces(doc, L)]
  found = [
    (inputs[r, a:b].tolist(), labels[r, a:b].tolist()) for r, a, b in packing.spans(segment_ids)
  ]
  assert sorted(found) == sorted(windows)
  assert len(inputs) < len(text_bytes.windows(CORPUS, L)[0])  # fewer rows than windows
  # every byte once; a label is its own document's byte, read after the byte before it
  assert sum(int((labels >= 0).sum()) for _ in [0]) == sum(len(d) for d in CORPUS)
  for r, a, b in packing.spans(segment_ids):
    x, y = inputs[r, a:b], labels[r, a:b]
    doc = next(d for d in CORPUS if bytes(y.astype(np.uint8).tolist()) in d)
    start = doc.index(bytes(y.astype(np.uint8).tolist()))
    before = [text_bytes.START] + list(doc)
    assert x.tolist() == before[start : start + len(x)]  # never the previous document's


# The loss on packed rows: a stand-in causal model with the packed interface.

VOCAB, WIDTH = 257, 8


class DocumentBag:
  """Logits of the mean embedding of the tokens up to each one (its document's, given
  segment ids; with `leaks`, the whole row's) plus a learned embedding of its position:
  a model that is exact for packed rows only if it keeps documents apart and restarts
  positions."""

  def __init__(self, leaks=False):
    self.leaks = leaks
    keys = jax.random.split(jax.random.key(0), 3)
    self.embed = jax.random.normal(keys[0], (VOCAB + 1, WIDTH))
    self.position = jax.random.normal(keys[1], (L, WIDTH))
    self.out = jax.random.normal(keys[2], (WIDTH, VOCAB))

  def apply(
    self,
    variables,
    tokens,
    *,
    train,
    rngs,
    positions=None,
    segment_ids=None,
    segment_positions=None,
  ):
    """CausalTransformer's interface: logits at `positions` `[b, k]` (all: None);
    `segment_ids` keep documents apart, `segment_positions` default to their positions."""
    del variables, train, rngs
    b, n = tokens.shape
    if segment_ids is None or self.leaks:
      mask = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n))
      where = jnp.broadcast_to(jnp.arange(n), (b, n))
    else:
      mask = segments.attention_mask(segment_ids, causal=True)[:, 0]
      where = segments.positions(segment_ids)
    if segment_positions is not None:
      where = segment_positions
    mask = mask.astype(jnp.float32)
    context = mask @ self.embed[tokens] / jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
    logits = (context + self.position[where]) @ self.out
    if positions is None:
      return logits
    return jnp.take_along_axis(logits, positions[..., None], axis=1)


def _batch(inputs, labels, segment_ids=None):
  batch = {
    'inputs': jnp.asarray(inputs, jnp.int32),
    'label': jnp.asarray(sequences.scored(np.asarray(labels))),
    'mask': jnp.ones(len(inputs), jnp.float32),
  }
  if segment_ids is not None:
    batch['segment_ids'] = jnp.asarray(segment_ids, jnp.int32)
  return batch


def _sums(model, batch):
  _, metrics = byte_lm.loss_and_metrics(model, None, batch, train=False)
  return {k: float(v) for k, v in metrics.items()}


def test_a_packed_batch_scores_as_its_windows_unpacked_and_counts_real_tokens():
  packed = _batch(*text_bytes.packed(CORPUS, L))
  unpacked = _batch(*text_bytes.windows(CORPUS, L))
  model = DocumentBag()
  a, b = _sums(model, packed), _sums(model, unpacked)
  assert a['count'] == b['count'] == a['tokens'] == sum(len(d) for d in CORPUS)
  assert a['accuracy'] == b['accuracy']
  np.testing.assert_allclose(a['loss'], b['loss'], rtol=1e-6)
  np.testing.assert_allclose(a['bits_per_byte'], b['bits_per_byte'], rtol=1e-6)
  # a model that reads across the documents of a row scores the packed rows otherwise
  leaky = _sums(DocumentBag(leaks=True), packed)
  assert abs(leaky['loss'] - b['loss']) > 1e-3 * b['loss']


def test_padding_is_never_scored_and_padding_rows_count_nothing():
  inputs, labels, segment_ids = text_bytes.packed(CORPUS, L)
  batch = _batch(inputs, labels, segment_ids)
  scored, label_tokens = batch['label'][..., 0], batch['label'][..., 1]
  # a label placed at a padding token (the data checks refuse such a file) is dropped
  r, c = np.argwhere(segment_ids == 0)[0]
  forged = np.asarray(batch['label']).copy()
  forged[r, -1] = (c, 65)
  weight = sequence_labelling.weights(dict(batch, label=forged), forged[..., 0], forged[..., 1])
  assert float(weight.sum()) == float(sequence_labelling.weights(batch, scored, label_tokens).sum())
  # a padding row (mask 0) counts no token and no label
  masked = dict(batch, mask=batch['mask'].at[0].set(0.0))
  real = (segment_ids != 0).sum(1)
  assert float(sequence_labelling.real_tokens(masked)) == real.sum() - real[0]
  assert float(sequence_labelling.real_tokens(dict(batch, segment_ids=None))) == inputs.size

"""The sequence-labelling `.npz` format: token sequences with a label at each position.

    examples = arrays.read_npz(path, parse=sequences.parse)   # the 'arrays' source does this
    sequences.check(examples, vocab_size=8192, max_length=128)

A file holds two arrays (Hugging Face's and Zoology's convention):

  * `inputs`: integer `[n, length]`, token ids in 0..vocab_size-1, or vocab_size, the
    causal model's start token (`CausalTransformer.start_token`; a byte language model's
    document starts with it, `text_bytes.py`);
  * `labels`: integer `[n, length]`, the token id each position must predict
    (0..vocab_size-1), or -100 where the position is not scored.

A file of packed rows (`packing.py`) also holds `segment_ids`: integer `[n, length]`,
the document of each token (a run of one id), 0 for padding, which is never scored. A
model that keeps documents apart reads each document as if it were alone, its positions
restarting at 0 (`efficient_attn/ops/segments.py`); so a label is the next token of its
own document (a language model's last token of a document is not scored, or scored with
its own document's end token), never the first token of the next.

Any integer dtype is read (stored as int32); other keys are ignored. A model
reads `inputs` causally and is scored where `labels` is not -100, so a
language model stores its next-token targets there (inputs shifted left) and
a task like MQAR (`mqar.py`) scores only the positions that must answer.
Sequences shorter than `dataset.max_length` are padded with input 0 and
label -100 (unscored); longer ones are refused.

Each problem is a one-line ValueError naming the file: a missing key, a
non-integer dtype, a shape that is not `[n, length]` or differs between the
two arrays (`parse`); inputs or labels outside the vocabulary, a negative
label other than -100, no scored position at all, sequences longer than the
model's context (`check`,
called by `train.validate` before any workdir is written).
"""

import numpy as np

from data.examples import Examples

IGNORE = -100  # the label of a position that is not scored
KEYS = ('inputs', 'labels')
SEGMENT_IDS = 'segment_ids'  # optional: packed rows (`packing.py`)


def parse(npz, path: str):
  """Examples of an open `.npz` archive (`np.load`) in this format; ValueError naming `path`."""
  missing = [k for k in KEYS if k not in npz.files]
  if missing:
    raise ValueError(
      f'{path} has no {missing[0]!r} array; a sequence-labelling file needs '
      f'inputs and labels, int [n, length] (it has '
      f'{", ".join(npz.files) or "no arrays"})'
    )
  data = {}
  for key in KEYS:
    a = np.asarray(npz[key])
    if not np.issubdtype(a.dtype, np.integer):
      raise ValueError(
        f'{path}: {key!r} must be integers, got {a.dtype}'
        + ('; store token ids as ints (.astype(np.int32))' if a.dtype.kind in 'fb' else '')
      )
    if a.ndim != 2:
      raise ValueError(f'{path}: {key!r} must be [n, length], got shape {list(a.shape)}')
    if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
      raise ValueError(f'{path}: {key!r} must fit int32, got {a.min()}..{a.max()}')
    data[key] = a.astype(np.int32)
  if data['inputs'].shape != data['labels'].shape:
    raise ValueError(
      f'{path}: inputs {list(data["inputs"].shape)} and labels '
      f'{list(data["labels"].shape)} must have the same shape [n, length]'
    )
  segment_ids = None
  if SEGMENT_IDS in npz.files:
    segment_ids = np.asarray(npz[SEGMENT_IDS])
    if (
      not np.issubdtype(segment_ids.dtype, np.integer) or segment_ids.shape != data['inputs'].shape
    ):
      raise ValueError(
        f'{path}: {SEGMENT_IDS!r} must be integers of the shape of inputs '
        f'{list(data["inputs"].shape)}, got {segment_ids.dtype} {list(segment_ids.shape)}'
      )
    if segment_ids.size and (segment_ids.min() < 0 or segment_ids.max() > np.iinfo(np.int32).max):
      raise ValueError(
        f'{path}: {SEGMENT_IDS!r} must be >= 0 (0: padding) and fit int32, got '
        f'{segment_ids.min()}..{segment_ids.max()}'
      )
    segment_ids = segment_ids.astype(np.int32)
  return Examples(data['inputs'], data['labels'], path, segment_ids)


def check(
  examples, vocab_size: int, max_length: int, vocab: str = 'config.dataset.vocab_size'
) -> None:
  """ValueError naming `examples.origin`: tokens or labels outside 0..vocab_size-1 (inputs
  may also be vocab_size, the start token; labels -100), or sequences longer than `max_length`
  (config.dataset.max_length)."""
  x, y = examples.inputs, examples.labels
  where = examples.origin
  if x.shape[1] > max_length:
    raise ValueError(
      f'{where}: sequences of {x.shape[1]} tokens exceed config.dataset.'
      f'max_length={max_length}; valid: files of length <= {max_length}'
    )
  bad = (x < 0) | (x > vocab_size)
  if bad.any():
    raise ValueError(
      f'{where}: inputs must be token ids in 0..{vocab_size - 1} ({vocab}='
      f'{vocab_size}) or {vocab_size} (the start token), got {x[bad][0]} '
      f'({int(bad.sum())} of {x.size} tokens)'
    )
  bad = ((y < 0) & (y != IGNORE)) | (y >= vocab_size)
  if bad.any():
    raise ValueError(
      f'{where}: labels must be token ids in 0..{vocab_size - 1} ({vocab}='
      f'{vocab_size}) or {IGNORE} (not scored), got {y[bad][0]} '
      f'({int(bad.sum())} of {y.size} labels)'
    )
  if len(y) and not (y != IGNORE).any():
    raise ValueError(
      f'{where}: every label is {IGNORE}, so no position is scored; a '
      f'sequence-labelling file needs labels to learn and measure'
    )
  if examples.segment_ids is not None:
    padding = (examples.segment_ids == 0) & (y != IGNORE)
    if padding.any():
      raise ValueError(
        f'{where}: {int(padding.sum())} labels are scored at padding (segment_ids 0); '
        f'a padding position must have label {IGNORE}'
      )


def scored(labels: np.ndarray) -> np.ndarray:
  """int32 `[n, k, 2]`: (position, label) of each scored position of `labels` `[n, length]`
  in order, k the most in one row (at least 1), rows with fewer padded with (0, -100)."""
  mask = labels != IGNORE
  k = max(int(mask.sum(1).max()) if len(labels) else 0, 1)
  out = np.zeros((len(labels), k, 2), np.int32)
  out[..., 1] = IGNORE
  # Scored positions first, each row in order (a stable sort of "not scored").
  order = np.argsort(~mask, axis=1, kind='stable')[:, :k]
  take = np.take_along_axis(mask, order, axis=1)
  out[..., 0] = np.where(take, order, 0)
  out[..., 1] = np.where(take, np.take_along_axis(labels, order, axis=1), IGNORE)
  return out


def pad(examples, max_length: int):
  """(inputs, labels) int32 `[n, max_length]`: padded with input 0 and label -100."""
  x, y = examples.inputs, examples.labels
  extra = ((0, 0), (0, max_length - x.shape[1]))
  return (
    np.pad(x, extra).astype(np.int32),
    np.pad(y, extra, constant_values=IGNORE).astype(np.int32),
  )


def pad_segment_ids(examples, max_length: int):
  """int32 `[n, max_length]` segment ids of packed `examples`, padded with 0; None when
  they are not packed."""
  ids = examples.segment_ids
  if ids is None:
    return None
  return np.pad(ids, ((0, 0), (0, max_length - ids.shape[1]))).astype(np.int32)

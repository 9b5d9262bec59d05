"""One split of a dataset in memory (`Examples`): what every in-memory reader returns.

    examples = Examples(inputs, labels, origin='mnist_train.npz')

Its own module, below the readers: `arrays.py` (the `.npz`, TFDS and scikit-learn
sources) and `sequences.py` (the sequence-labelling format, which `arrays.py` reads
with) both build it, and neither imports the other for it.
"""

import dataclasses
from typing import Any, Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class Examples:
  """One split in memory.

  Attributes:
    inputs: images `[n, h, w, c]` (uint8, or float32 in 0..255), a list of n
      `bytes` (text), a list of n `(bytes, bytes)` (text pairs) or int tokens
      `[n, length]`.
    labels: int32 `[n]` (sequence labelling: `[n, length]`).
    origin: where the split was read from (a file, or a dataset and split),
      for messages.
    segment_ids: packed sequences (`packing.py`): int32 `[n, length]`, the document of
      each token (0: padding); None when each row is one sequence.
  """

  inputs: Any
  labels: np.ndarray
  origin: str = ''
  segment_ids: Optional[np.ndarray] = None

  def __len__(self):
    return len(self.labels)

  def take(self, index: np.ndarray) -> 'Examples':
    segment_ids = None if self.segment_ids is None else self.segment_ids[index]
    if isinstance(self.inputs, np.ndarray):
      return Examples(self.inputs[index], self.labels[index], self.origin, segment_ids)
    return Examples([self.inputs[i] for i in index], self.labels[index], self.origin, segment_ids)

"""In-memory input pipeline: datasets decoded once, batched and augmented with numpy.

Preparation runs once per split (`prepare`): images are resized to
`dataset.image_size`, converted to `dataset.channels` and passed through
`dataset.transform`; text becomes byte ids; images become pixel tokens when
`dataset.pixels_as_tokens`. Each batch then costs an index, an optional
crop / flip and a normalisation.

Training order: epoch e is `default_rng([seed, e]).permutation(N)`; step s of an
epoch takes the global batch `perm[s*B:(s+1)*B]` and process p its slice
`[p*B/P:(p+1)*B/P]`. Augmentation is drawn for the whole global batch from
`default_rng([seed, step, 1])`. So the global batch of a step is the same for
any process count, and resuming at step s costs one permutation.
"""

import itertools
from typing import Tuple

import numpy as np

from data import arrays
from data import specs
from data import transforms

_GRAY = np.asarray([0.2989, 0.5870, 0.1140], np.float32)  # tf.image.rgb_to_grayscale


def _channels(images: np.ndarray, channels: int) -> np.ndarray:
  c = images.shape[-1]
  if c == channels:
    return images
  if c == 1:
    return np.repeat(images, channels, axis=-1)
  if c == 3 and channels == 1:
    gray = images.astype(np.float32) @ _GRAY[:, None]
    return np.round(gray).astype(np.uint8) if images.dtype == np.uint8 else gray
  raise ValueError(
    f'config.dataset.channels={channels} is not valid for images with {c} '
    f'channels; valid choices: {c}' + (', 1' if c == 3 else '')
  )


def _resize(images: np.ndarray, size: int) -> np.ndarray:
  """`[n, h, w, c]` -> float32 `[n, size, size, c]` (antialiased bilinear, values kept)."""
  if images.shape[1] == size and images.shape[2] == size:
    return images
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  out = [
    tf.image.resize(tf.cast(images[i : i + 4096], tf.float32), [size, size], antialias=True).numpy()
    for i in range(0, len(images), 4096)
  ]
  return np.concatenate(out) if out else np.zeros((0, size, size, images.shape[-1]), np.float32)


def _transform(images: np.ndarray, name: str) -> np.ndarray:
  if name in ('', 'none'):
    return images
  fn = transforms.get_transform(name)
  if images.dtype == np.uint8:
    return np.asarray(fn(images))
  return np.asarray(fn(images / 255.0)) * 255.0


def byte_ids(texts, max_length: int) -> np.ndarray:
  """UTF-8 `bytes` -> uint16 ids `[n, max_length]`: byte b is id b + 1, 0 pads."""
  out = np.zeros((len(texts), max_length), np.uint16)
  for i, t in enumerate(texts):
    b = np.frombuffer(t[:max_length], np.uint8)
    out[i, : len(b)] = b.astype(np.uint16) + 1
  return out


def prepare(dataset: specs.Dataset, examples: arrays.Examples) -> Tuple[np.ndarray, np.ndarray]:
  """(inputs as stored for batching, labels) of one split; see the module docstring."""
  d, kind = dataset.fields, dataset.input_kind
  x = examples.inputs
  if kind == 'text':
    if not isinstance(x, list):
      raise ValueError(
        f'dataset {d.name!r} is text, but the source holds arrays of shape {np.shape(x)}'
      )
    return byte_ids(x, d.max_length), examples.labels
  if kind == 'text_pair':  # [n, 2, max_length]
    first, second = zip(*x) if len(x) else ((), ())
    return np.stack(
      [byte_ids(first, d.max_length), byte_ids(second, d.max_length)], 1
    ), examples.labels
  if kind == 'sequence':  # checked by `sequences.check`; labels as (position, token) pairs
    from data import sequences  # pylint: disable=g-import-not-at-top

    x, y = sequences.pad(examples, d.max_length)
    return x, sequences.scored(y)
  if kind == 'tokens':
    x = np.asarray(x)
    length = d.max_length or x.shape[1]
    x = np.pad(x[:, :length], ((0, 0), (0, max(length - x.shape[1], 0))))
    return x.astype(np.int32), examples.labels
  if not isinstance(x, np.ndarray) or x.ndim != 4:
    raise ValueError(
      f'dataset {d.name!r} holds images, but the source holds {type(x).__name__} inputs'
    )
  x = _channels(x, d.channels)
  if kind == 'pixels':
    if x.shape[1:3] != (d.image_size, d.image_size):
      raise ValueError(
        f'config.dataset.image_size={d.image_size} is not valid with '
        f'pixels_as_tokens: the images are stored at {x.shape[1]}x{x.shape[2]} '
        f'and pixel tokens are not resized; valid choices: {x.shape[1]}'
      )
    x = _transform(x, d.get('transform', ''))
    return np.round(x).astype(np.uint8).reshape(len(x), -1), examples.labels
  x = _transform(_resize(x, d.image_size), d.get('transform', ''))
  return x, examples.labels


def crop_flip(images: np.ndarray, rng: np.random.Generator, flip: bool) -> np.ndarray:
  """Zero-pad size/8 pixels, take a random crop of the original size, maybe flip.

  images `[b, h, w, c]` in 0..255 (CIFAR-style augmentation, as
  `preprocess.pad_crop_flip` does in tf.data).
  """
  b, h, w, _ = images.shape
  pad = max(h // 8, 1)
  padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  ys = rng.integers(0, 2 * pad + 1, size=b)
  xs = rng.integers(0, 2 * pad + 1, size=b)
  flips = rng.random(b) < 0.5 if flip else np.zeros(b, bool)
  out = np.empty_like(images)
  for i in range(b):
    crop = padded[i, ys[i] : ys[i] + h, xs[i] : xs[i] + w]
    out[i] = crop[:, ::-1] if flips[i] else crop
  return out


class _Split:
  """A prepared split and how its batches' inputs are finished (normalised)."""

  def __init__(self, dataset: specs.Dataset, split: str):
    self.kind = dataset.input_kind
    examples = arrays.get_split(dataset, split)
    self.inputs, self.labels = prepare(dataset, examples)
    self.segment_ids = None  # packed sequences: `[n, max_length]`, 0 for padding
    if self.kind == 'sequence':
      from data import sequences  # pylint: disable=g-import-not-at-top

      self.segment_ids = sequences.pad_segment_ids(examples, dataset.fields.max_length)
    self.num_examples = len(self.labels)
    self.norm = None
    if self.kind == 'image':
      self.norm = specs.normalization(dataset) or _measured(dataset)

  def rows(self, index) -> dict:
    """'segment_ids' of the rows `index` (an index array or a slice), for a packed split;
    else nothing."""
    return {} if self.segment_ids is None else {'segment_ids': self.segment_ids[index]}

  def finish(self, x: np.ndarray) -> np.ndarray:
    if self.kind == 'image':
      mean, std = self.norm
      return ((x.astype(np.float32) / 255.0 - mean) / std).astype(np.float32)
    return x.astype(np.int32)


def _measured(dataset: specs.Dataset) -> Tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and std of the training images (for datasets without presets)."""
  x, _ = prepare(dataset, arrays.get_split(dataset, dataset.fields.train_split))
  x = x.reshape(-1, x.shape[-1]).astype(np.float64) / 255.0
  return x.mean(0).astype(np.float32), np.maximum(x.std(0), 1e-3).astype(np.float32)


class TrainData(_Split):
  """Endless shuffled training batches; see the module docstring for the order."""

  def __init__(self, dataset: specs.Dataset, process_index: int, process_count: int):
    super().__init__(dataset, dataset.fields.train_split)
    self.global_batch = dataset.fields.batch_size
    self.local_batch = specs.local_batch_size(self.global_batch, process_count, 'batch_size')
    if self.global_batch > self.num_examples:
      raise ValueError(
        f'config.dataset.batch_size={self.global_batch} exceeds the '
        f'{self.num_examples} training examples'
      )
    self.steps_per_epoch = self.num_examples // self.global_batch
    self.seed = dataset.seed
    self.process_index = process_index
    self.augment = dataset.fields.augment if self.kind == 'image' else 'none'

  def permutation(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)

  def batches(self, start_step: int = 0):
    epoch, perm = -1, None
    lo = self.process_index * self.local_batch
    for step in itertools.count(start_step):
      e, i = divmod(step, self.steps_per_epoch)
      if e != epoch:
        epoch, perm = e, self.permutation(e)
      idx = perm[i * self.global_batch : (i + 1) * self.global_batch]
      if self.augment in ('crop', 'crop_flip'):
        rng = np.random.default_rng([self.seed, step, 1])
        x = crop_flip(self.inputs[idx], rng, flip=self.augment == 'crop_flip')[
          lo : lo + self.local_batch
        ]
      else:
        x = self.inputs[idx[lo : lo + self.local_batch]]
      yield {
        'inputs': self.finish(x),
        'label': self.labels[idx[lo : lo + self.local_batch]],
        'mask': np.ones(self.local_batch, np.float32),
        **self.rows(idx[lo : lo + self.local_batch]),
      }


class EvalData(_Split):
  """Every example of the split once; process p reads the p-th contiguous shard, in
  batches of `specs.eval_local_batch` rows (the last padded with mask-0 rows)."""

  def __init__(
    self,
    dataset: specs.Dataset,
    split: str,
    process_index: int,
    process_count: int,
    row_multiple: int = 1,
  ):
    super().__init__(dataset, split)
    self.local_batch = specs.eval_local_batch(
      dataset.fields.eval_batch_size, process_count, row_multiple
    )
    per_process = -(-self.num_examples // process_count)
    self.num_batches = -(-per_process // self.local_batch)
    self.lo = min(process_index * per_process, self.num_examples)
    self.hi = min(self.lo + per_process, self.num_examples)

  def batches(self):
    b = self.local_batch
    for i in range(self.num_batches):
      lo, hi = min(self.lo + i * b, self.hi), min(self.lo + (i + 1) * b, self.hi)
      x, y = self.finish(self.inputs[lo:hi]), self.labels[lo:hi]
      yield {
        'inputs': specs.pad_rows(x, b),
        'label': specs.pad_rows(y, b),
        'mask': specs.pad_rows(np.ones(hi - lo, np.float32), b),
        **{k: specs.pad_rows(v, b) for k, v in self.rows(slice(lo, hi)).items()},
      }

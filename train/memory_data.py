"""In-memory datasets: scikit-learn's 8x8 digits, batched with numpy.

Images are normalised `[n, 8, 8, 1]` float32, or with `dataset.pixels_as_tokens`
the 17 intensities 0..16 rescaled to tokens round(v * 255 / 16) `[n, 64]` int32.

Training order: epoch e is `default_rng([seed, e]).permutation(N)`, step s of an
epoch takes the global batch `perm[s*B:(s+1)*B]` and process p its slice
`[p*B/P:(p+1)*B/P]`, so the global batch is the same for any process count and
resuming costs one permutation.
"""
import itertools

import numpy as np

from train import datasets


def load_digits(test_fraction: float = 0.2, split_seed: int = 0):
  """{'train': (images, labels), 'test': ...}: images `[n, 8, 8, 1]` in [0, 1].

  A fixed stratified split of the 1797 images (1437 train / 360 test).
  """
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  digits = sk_datasets.load_digits()
  images = (digits.images / 16.0).astype(np.float32)[..., None]
  labels = digits.target.astype(np.int32)
  x_train, x_test, y_train, y_test = model_selection.train_test_split(
      images, labels, test_size=test_fraction, stratify=labels, random_state=split_seed)
  return {'train': (x_train, y_train), 'test': (x_test, y_test)}


def _load(config, spec, split: str):
  if spec.name != 'digits':
    raise ValueError(f'no in-memory loader for dataset {spec.name!r}')
  splits = load_digits()
  if split not in splits:
    raise ValueError(f'config.dataset split {split!r} is not valid for digits; valid '
                     f'choices: {", ".join(splits)}')
  images, labels = splits[split]
  mean = np.asarray(spec.mean, np.float32)
  std = np.asarray(spec.std, np.float32)
  if config.dataset.image_size not in (0, images.shape[1]):
    raise ValueError(f'config.dataset.image_size={config.dataset.image_size} is not valid '
                     f'for digits; valid choices: 8')
  if config.dataset.get('pixels_as_tokens'):  # 0..16 rescaled to tokens 0..255
    return np.round(images * 255).astype(np.int32).reshape(len(images), -1), labels
  return (images - mean) / std, labels


class TrainData:
  """Endless shuffled training batches; see the module docstring for the order."""

  def __init__(self, config, spec, process_index: int, process_count: int):
    self.images, self.labels = _load(config, spec, config.dataset.train_split)
    self.num_examples = len(self.labels)
    self.global_batch = config.dataset.batch_size
    self.local_batch = datasets.local_batch_size(self.global_batch, process_count, 'batch_size')
    if self.global_batch > self.num_examples:
      raise ValueError(f'config.dataset.batch_size={self.global_batch} exceeds the '
                       f'{self.num_examples} training examples')
    self.steps_per_epoch = self.num_examples // self.global_batch
    self.seed = config.train.seed
    self.process_index = process_index

  def permutation(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)

  def batches(self, start_step: int = 0):
    epoch, perm = -1, None
    for step in itertools.count(start_step):
      e, i = divmod(step, self.steps_per_epoch)
      if e != epoch:
        epoch, perm = e, self.permutation(e)
      start = i * self.global_batch + self.process_index * self.local_batch
      idx = perm[start:start + self.local_batch]
      yield {'inputs': self.images[idx], 'label': self.labels[idx],
             'mask': np.ones(len(idx), np.float32)}


class EvalData:
  """Every example of the split once; process p reads the p-th contiguous shard."""

  def __init__(self, config, spec, split: str, process_index: int, process_count: int):
    images, labels = _load(config, spec, split)
    self.num_examples = len(labels)
    self.local_batch = datasets.local_batch_size(config.dataset.eval_batch_size, process_count,
                                   'eval_batch_size')
    per_process = -(-self.num_examples // process_count)
    self.num_batches = -(-per_process // self.local_batch)
    lo = min(process_index * per_process, self.num_examples)
    hi = min(lo + per_process, self.num_examples)
    self.images, self.labels = images[lo:hi], labels[lo:hi]

  def batches(self):
    b = self.local_batch
    for i in range(self.num_batches):
      x, y = self.images[i * b:(i + 1) * b], self.labels[i * b:(i + 1) * b]
      n = len(y)
      yield {'inputs': datasets.pad_rows(x, b), 'label': datasets.pad_rows(y, b),
             'mask': datasets.pad_rows(np.ones(n, np.float32), b)}


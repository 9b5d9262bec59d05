"""Dataset registry and the one entry point to every input pipeline.

    spec = datasets.get_spec('cifar10')
    train_data = datasets.get_train_data(config)   # .steps_per_epoch, .batches(start_step)
    eval_data = datasets.get_eval_data(config)     # .num_batches, .batches()
    batch = datasets.get_eval_batch(config)        # one local eval batch, for analysis

Batches are dicts of numpy arrays for this process (the local slice of the
global batch): 'inputs' (images `[b, h, w, c]` float32 normalised, text tokens
`[b, max_length]` int32 with 0 = padding, or with `dataset.pixels_as_tokens`
pixel tokens `[b, h*w]` int32 in 0..255, raster order, neither resized nor
normalised), 'label' `[b]` int32 and 'mask' `[b]` float32 (0 for the padding
rows that complete the last eval batch). `dataset.transform` (a
`train.lora_data` spec such as 'rotated') changes train and eval images alike,
on the pixel values before normalisation.

Order: the training batch of step s is a pure function of (seed, s, process
count), so a run resumed at step s sees exactly the batches an uninterrupted
run sees from step s. Each process reads only its own shard of the data.
"""
import dataclasses
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """What the pipelines need to know about a dataset.

  Attributes:
    name: registry name (`config.dataset.name`).
    kind: 'image' or 'text' (what `config.model.kind` must consume).
    source: 'memory' (loaded into numpy), 'tfds' or 'folder' (tfds.ImageFolder).
    num_classes: label count; 0 means read it from the data (ImageFolder).
    mean, std: per-channel normalisation of images scaled to [0, 1].
    feature: the TFDS feature holding the input ('image' or 'text').
    manual: TFDS needs manually downloaded files (`dataset.manual_dir`).
  """
  name: str
  kind: str
  source: str
  num_classes: int
  mean: Tuple[float, ...] = (0.5,)
  std: Tuple[float, ...] = (0.5,)
  feature: str = 'image'
  manual: bool = False


DATASETS = {spec.name: spec for spec in (
    DatasetSpec('digits', 'image', 'memory', 10, (0.3053,), (0.3760,)),
    DatasetSpec('mnist', 'image', 'tfds', 10, (0.1307,), (0.3081,)),
    DatasetSpec('cifar10', 'image', 'tfds', 10, (0.4914, 0.4822, 0.4465),
                (0.2470, 0.2435, 0.2616)),
    DatasetSpec('cifar100', 'image', 'tfds', 100, (0.5071, 0.4865, 0.4409),
                (0.2673, 0.2564, 0.2762)),
    DatasetSpec('imagenet2012', 'image', 'tfds', 1000, (0.485, 0.456, 0.406),
                (0.229, 0.224, 0.225), manual=True),
    DatasetSpec('imdb_reviews', 'text', 'tfds', 2, feature='text'),
    DatasetSpec('image_folder', 'image', 'folder', 0, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
)}

AUGMENTATIONS = ('none', 'crop_flip', 'inception_crop')
TEXT_VOCAB_SIZE = 257  # bytes 0..255 as ids 1..256; 0 is padding


def get_spec(name: str) -> DatasetSpec:
  if name not in DATASETS:
    raise ValueError(f'config.dataset.name={name!r} is not valid; valid choices: '
                     f'{", ".join(DATASETS)}')
  return DATASETS[name]


def input_kind(config) -> str:
  """What the pipeline yields: 'image', 'text' or 'pixels' (image tokens)."""
  kind = get_spec(config.dataset.name).kind
  return 'pixels' if kind == 'image' and config.dataset.get('pixels_as_tokens') else kind


def _processes(process_index: Optional[int], process_count: Optional[int]):
  return (jax.process_index() if process_index is None else process_index,
          jax.process_count() if process_count is None else process_count)


def get_train_data(config, *, process_index: Optional[int] = None,
                   process_count: Optional[int] = None):
  """The training stream of this process (defaults: jax.process_index/count).

  Returns an object with `num_examples` (global), `steps_per_epoch` and
  `batches(start_step)`, an endless iterator of local batches from that step.
  """
  spec = get_spec(config.dataset.name)
  pid, count = _processes(process_index, process_count)
  if spec.source == 'memory':
    from train import memory_data  # pylint: disable=g-import-not-at-top
    return _transformed(config, memory_data.TrainData(config, spec, pid, count))
  from train import tfds_data  # pylint: disable=g-import-not-at-top
  return _transformed(config, tfds_data.TrainData(config, spec, pid, count))


def get_eval_data(config, split: str = '', *, process_index: Optional[int] = None,
                  process_count: Optional[int] = None):
  """Evaluation batches of `split` (default `config.dataset.eval_split`).

  Returns an object with `num_examples` (global), `num_batches` (the same on
  every process) and `batches()`; every example appears once across processes,
  padding rows have mask 0.
  """
  spec = get_spec(config.dataset.name)
  split = split or config.dataset.eval_split
  pid, count = _processes(process_index, process_count)
  if spec.source == 'memory':
    from train import memory_data  # pylint: disable=g-import-not-at-top
    return _transformed(config, memory_data.EvalData(config, spec, split, pid, count))
  from train import tfds_data  # pylint: disable=g-import-not-at-top
  return _transformed(config, tfds_data.EvalData(config, spec, split, pid, count))


def input_transform(config):
  """`config.dataset.transform` as a function on batches of 'inputs', or None.

  The `train.lora_data` transform sees the pixel values before normalisation:
  pixel tokens `[b, h*w]` as 0..255 images `[b, h, w]`; normalised images
  `[b, h, w, c]` as x * std + mean in [0, 1] (renormalised afterwards, which
  equals transforming before normalising). It runs jit-compiled on the CPU.
  """
  name = config.dataset.get('transform', '')
  if name in ('', 'none'):
    return None
  from train import lora_data  # pylint: disable=g-import-not-at-top
  transform = lora_data.get_transform(name)
  spec = get_spec(config.dataset.name)
  mean, std = np.asarray(spec.mean, np.float32), np.asarray(spec.std, np.float32)
  side = config.dataset.image_size

  @jax.jit
  def fn(inputs):
    if jnp.issubdtype(inputs.dtype, jnp.integer):  # pixel tokens
      images = inputs.reshape((inputs.shape[0], side, side))
      return transform(images).reshape(inputs.shape)
    return (transform(inputs * std + mean) - mean) / std

  cpu = jax.local_devices(backend='cpu')[0]
  return lambda inputs: np.asarray(fn(jax.device_put(inputs, cpu)))


class _Transformed:
  """A train or eval data object whose batches' 'inputs' pass through `fn`."""

  def __init__(self, data, fn):
    self.data, self.fn = data, fn

  def __getattr__(self, name):
    return getattr(self.data, name)

  def batches(self, *args, **kwargs):
    for batch in self.data.batches(*args, **kwargs):
      yield dict(batch, inputs=self.fn(batch['inputs']))


def _transformed(config, data):
  fn = input_transform(config)
  return data if fn is None else _Transformed(data, fn)


def get_eval_batch(config, split: str = ''):
  """The first local evaluation batch of `config`'s dataset (numpy dict)."""
  return next(iter(get_eval_data(config, split).batches()))


def num_classes(config) -> int:
  """`config.dataset.num_classes`, or the count read from the data when it is 0."""
  if config.dataset.num_classes > 0:
    return config.dataset.num_classes
  spec = get_spec(config.dataset.name)
  if spec.num_classes:
    return spec.num_classes
  from train import tfds_data  # pylint: disable=g-import-not-at-top
  return tfds_data.folder_num_classes(config)


def prepare(config) -> None:
  """Makes sure the data can be read (TFDS download_and_prepare when allowed).

  Raises ValueError naming the field (data_dir, manual_dir, download) when the
  dataset is missing and cannot be prepared. Call before any training work.
  """
  spec = get_spec(config.dataset.name)
  if spec.source == 'memory':
    return
  from train import tfds_data  # pylint: disable=g-import-not-at-top
  tfds_data.prepare(config, spec)


def local_batch_size(global_size: int, process_count: int, field: str) -> int:
  """The per-process share of a global batch size `config.dataset.<field>`."""
  if global_size <= 0 or global_size % process_count:
    raise ValueError(f'config.dataset.{field}={global_size} must be a positive multiple '
                     f'of the number of processes ({process_count})')
  return global_size // process_count


def pad_rows(x, size: int):
  """Pads axis 0 of the numpy array `x` with zeros up to `size` rows."""
  if len(x) == size:
    return x
  return np.concatenate([x, np.zeros((size - len(x),) + x.shape[1:], x.dtype)])

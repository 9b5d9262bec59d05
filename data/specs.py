"""What the input pipeline knows about each dataset, and where it can be read from.

A dataset has an identity (`config.dataset.name`: its kind, classes, stored
image size, normalisation) and a *source* (`config.dataset.source`: where the
examples come from). Any source can serve any dataset of a kind it can hold,
so a model config (e.g. the MNIST ViT) runs on MNIST from TFDS, from an
`.npz` file or from a folder of PNGs by changing only the source:

  * 'tfds': `tfds.builder(name, data_dir=dataset.data_dir)`;
  * 'arrays': `.npz` files, `dataset.data_dir` is the file (a '{split}' in the
    path names one file per split); see `data/arrays.py` for the keys;
  * 'folder': `dataset.data_dir/<split>/<label>/<image>` (`tfds.ImageFolder`);
  * 'sklearn': scikit-learn's bundled 8x8 digits (no download);
  * 'generated': a task the project generates (Long Range Arena ListOps and
    Pathfinder, Zoology's MQAR), written once to `dataset.data_dir` and read as arrays;
  * 'tsv': the Long Range Arena's released AAN Retrieval files
    (`dataset.data_dir/new_aan_pairs.{train,eval,test}.tsv`, see `aan.py`).

Small datasets are read once, decoded and kept in memory (`memory.py`); large
ones (ImageNet, image folders) stream through tf.data (`stream.py`).
"""

import dataclasses
from typing import Any, Tuple, Union

import numpy as np


class DownloadError(RuntimeError):
  """TFDS could not download a dataset (no network, or the server refused)."""


SOURCES = ('tfds', 'arrays', 'folder', 'sklearn', 'generated', 'tsv')
AUGMENTATIONS = ('none', 'crop', 'crop_flip', 'inception_crop')
TEXT_VOCAB_SIZE = 257  # bytes 0..255 as ids 1..256; 0 is padding


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """One dataset's identity.

  Attributes:
    name: `config.dataset.name`.
    kind: 'image', 'text' (byte tokens), 'text_pair' (two byte-token documents),
      'tokens' (a generated token task) or 'sequence' (tokens with a label at each
      position, `sequences.py`).
    num_classes: label count; 0: read it from the data (image folders).
    channels: the channels of the stored images (0: not images); `mean` and `std`
      hold one value per channel.
    mean, std: per-channel normalisation of images scaled to [0, 1]; empty:
      computed from the training images (or set `dataset.mean` / `dataset.std`).
    default_source: the source used when `config.dataset.source` is ''.
    stored_size: the side of the stored images (0: varies), for pixel tokens.
    small: fits in memory (TFDS datasets read once into memory).
    feature: the TFDS feature holding the input.
    manual: TFDS prepares it only from manually downloaded files.
    vocab_size: token tasks: ids 0..vocab_size-1 (0 = padding).

  These facts are written here only: the config presets (`configs/presets.py`)
  read them.
  """

  name: str
  kind: str
  num_classes: int
  channels: int = 0
  mean: Tuple[float, ...] = ()
  std: Tuple[float, ...] = ()
  default_source: str = 'tfds'
  stored_size: int = 0
  small: bool = True
  feature: str = 'image'
  manual: bool = False
  vocab_size: int = 0

  def __post_init__(self):
    for what in ('mean', 'std'):
      values = getattr(self, what)
      if values and len(values) != self.channels:
        raise ValueError(
          f'DatasetSpec {self.name!r}: {what}={values} has {len(values)} '
          f'values; channels={self.channels} needs {self.channels}'
        )

  def sources(self) -> Tuple[str, ...]:
    """The sources that can serve this dataset."""
    if self.default_source in ('sklearn', 'generated'):
      return (self.default_source, 'arrays')
    if self.default_source in ('tsv', 'arrays'):
      return (self.default_source,)
    if self.name == 'image_folder':
      return ('folder', 'arrays')
    if self.kind == 'image':
      return ('tfds', 'arrays', 'folder')
    return ('tfds', 'arrays')


DATASETS = {
  spec.name: spec
  for spec in (
    DatasetSpec('digits', 'image', 10, 1, (0.3053,), (0.3760,), 'sklearn', stored_size=8),
    DatasetSpec('mnist', 'image', 10, 1, (0.1307,), (0.3081,), stored_size=28),
    DatasetSpec(
      'cifar10', 'image', 10, 3, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), stored_size=32
    ),
    DatasetSpec(
      'cifar100',
      'image',
      100,
      3,
      (0.5071, 0.4865, 0.4409),
      (0.2673, 0.2564, 0.2762),
      stored_size=32,
    ),
    DatasetSpec(
      'imagenet2012',
      'image',
      1000,
      3,
      (0.485, 0.456, 0.406),
      (0.229, 0.224, 0.225),
      small=False,
      manual=True,
    ),
    DatasetSpec('imdb_reviews', 'text', 2, feature='text'),
    DatasetSpec('image_folder', 'image', 0, 3, default_source='folder', small=False),
    # The Long Range Arena's generated tasks (Tay et al. 2021; `generated.py`).
    DatasetSpec('listops', 'tokens', 10, default_source='generated', vocab_size=16),
    DatasetSpec('pathfinder', 'image', 2, 1, default_source='generated', stored_size=32),
    # Retrieval: LRA's released ACL Anthology Network pairs (`aan.py`).
    DatasetSpec('aan', 'text_pair', 2, default_source='tsv', feature='text'),
    # Sequence labelling (`sequences.py`): Zoology's multi-query associative recall
    # (Arora et al. 2023; `mqar.py`), and any such .npz a user brings. The vocabulary
    # is `dataset.vocab_size`; the labels are tokens of it.
    DatasetSpec('mqar', 'sequence', 0, default_source='generated'),
    DatasetSpec('sequences', 'sequence', 0, default_source='arrays'),
    # Byte-level language modelling on a text corpus (`text_bytes.py`): windows of bytes,
    # each byte scored with its own value.
    DatasetSpec('text_bytes', 'sequence', 0, default_source='generated', vocab_size=256),
  )
}


def get_spec(name: str) -> DatasetSpec:
  if name not in DATASETS:
    raise ValueError(
      f'config.dataset.name={name!r} is not valid; valid choices: {", ".join(DATASETS)}'
    )
  return DATASETS[name]


def source(config) -> str:
  """The source that serves `config.dataset` ('' means the dataset's default)."""
  d = config.dataset
  spec = get_spec(d.name)
  src = d.get('source', '') or spec.default_source
  if src not in spec.sources():
    raise ValueError(
      f'config.dataset.source={src!r} is not valid for dataset {d.name!r}; '
      f'valid choices: {", ".join(spec.sources())}'
    )
  return src


def in_memory(config) -> bool:
  """Whether the dataset is read once into memory (else streamed by tf.data)."""
  src = source(config)
  return src in ('arrays', 'sklearn', 'generated', 'tsv') or (
    src == 'tfds' and get_spec(config.dataset.name).small
  )


def input_kind(config) -> str:
  """What the pipeline yields: 'image', 'text', 'text_pair', 'tokens' or 'pixels' (image tokens)."""
  kind = get_spec(config.dataset.name).kind
  return 'pixels' if kind == 'image' and config.dataset.get('pixels_as_tokens') else kind


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A config's dataset, resolved once (`resolve`): what the pipeline is handed instead
  of the config.

  Attributes:
    fields: `config.dataset`, the data's own group of the config.
    seed: `config.train.seed`, which orders the training examples.
    spec: the dataset's identity (`DATASETS`).
    source: where the examples come from (`source`).
    in_memory: read once into memory, else streamed (`in_memory`).
    input_kind: what the pipeline yields (`input_kind`).
  """

  fields: Any
  seed: int
  spec: DatasetSpec
  source: str
  in_memory: bool
  input_kind: str


def resolve(config: Union[Any, Dataset]) -> Dataset:
  """The `Dataset` of `config` (a `Dataset` is returned as it is). ValueError for an
  unknown dataset name or a source that cannot serve it."""
  if isinstance(config, Dataset):
    return config
  train = config.get('train')
  return Dataset(
    config.dataset,
    train.get('seed', 0) if train else 0,
    get_spec(config.dataset.name),
    source(config),
    in_memory(config),
    input_kind(config),
  )


def normalization(dataset: Dataset):
  """(mean, std) float32 arrays `[channels]` from the config, else the spec; None if unknown."""
  d, spec = dataset.fields, dataset.spec
  channels = d.channels
  values = []
  for what, preset in (('mean', spec.mean), ('std', spec.std)):
    value = np.asarray(tuple(d.get(what, ()) or ()) or preset, np.float32)
    if value.size and value.shape != (channels,) and value.shape != (1,):
      raise ValueError(
        f'config.dataset.{what}={tuple(value.tolist())} has {value.size} '
        f'values; dataset.channels={channels} needs {channels} (or 1)'
      )
    if what == 'std' and np.any(value <= 0):
      raise ValueError(f'config.dataset.std={tuple(value.tolist())} must be > 0')
    values.append(np.broadcast_to(value, (channels,)).copy() if value.size else None)
  return None if values[0] is None or values[1] is None else tuple(values)


def local_batch_size(global_size: int, process_count: int, field: str) -> int:
  """The per-process share of a global batch size `config.dataset.<field>`."""
  if global_size <= 0 or global_size % process_count:
    raise ValueError(
      f'config.dataset.{field}={global_size} must be a positive multiple '
      f'of the number of processes ({process_count})'
    )
  return global_size // process_count


def eval_local_batch(global_size: int, process_count: int, row_multiple: int = 1) -> int:
  """This process's evaluation batch: its share of `config.dataset.eval_batch_size`
  (rounded up) made a multiple of `row_multiple` (the devices its rows are split over),
  so that any eval batch size runs on any mesh; the rows added are padding (mask 0)."""
  if global_size < 1:
    raise ValueError(
      f'config.dataset.eval_batch_size={global_size} is not valid; valid: integers >= 1'
    )
  if row_multiple < 1:
    raise ValueError(f'row_multiple={row_multiple} is not valid; valid: integers >= 1')
  share = -(-global_size // process_count)
  return -(-share // row_multiple) * row_multiple


def pad_rows(x, size: int):
  """Pads axis 0 of the numpy array `x` with zeros up to `size` rows."""
  if len(x) == size:
    return x
  return np.concatenate([x, np.zeros((size - len(x),) + x.shape[1:], x.dtype)])

"""Streaming tf.data pipelines: large TFDS datasets (ImageNet) and image folders.

Folders hold `root/<split>/<label>/<image>` (PNG or JPEG, any size; images are
resized to `dataset.image_size`); the label folders, sorted, are the classes.

Sharding: process p of P reads `tfds.even_splits(split, P)[p]` (for an
ImageFolder, `ds.shard(P, p)`), so no two processes read the same example.

Training order: epoch e of process p uses the seed s = hash(seed, e, p) for
the file order (`ReadConfig.shuffle_seed`), the shuffle buffer and the
stateless augmentations, and the whole pipeline runs with
`options.deterministic = True`. The batches of step t are therefore a pure
function of (seed, t, P). Resuming at step t rebuilds epoch t // steps_per_epoch
and skips its first t % steps_per_epoch batches *before decoding*: the cost is
reading (not decoding or augmenting) at most one epoch of this process's
serialized records, about a second for CIFAR and a few minutes for ImageNet
from local disk.
"""

import itertools
import socket
import threading
import time
from typing import Iterable, List, Optional, Tuple
import urllib.parse
import urllib.request

from absl import logging
import jax
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from data import preprocess
from data import specs
from data.specs import DownloadError

tf.config.set_visible_devices([], 'GPU')  # tf.data only; keep the accelerators for JAX


def epoch_seed(seed: int, epoch: int, process_index: int) -> int:
  """A 31-bit seed for one epoch of one process."""
  return int(np.random.SeedSequence([seed, epoch, process_index]).generate_state(1)[0] >> 1)


def _read_config(shuffle_seed: Optional[int]) -> tfds.ReadConfig:
  options = tf.data.Options()
  options.deterministic = True
  return tfds.ReadConfig(
    shuffle_seed=shuffle_seed,
    shuffle_reshuffle_each_iteration=False,
    try_autocache=False,
    options=options,
  )


def folder_num_classes(data_dir: str) -> int:
  """The label folders of the image folder `data_dir` (`config.dataset.data_dir`)."""
  return tfds.ImageFolder(data_dir).info.features['label'].num_classes


def _folder_normalization(dataset: specs.Dataset):
  """Per-channel mean and std of (at most 512) training images of a folder."""
  d = dataset.fields
  ds = tfds.ImageFolder(d.data_dir).as_dataset(
    split=d.train_split, shuffle_files=False, decoders={'image': tfds.decode.SkipDecoding()}
  )
  fn = lambda ex: (
    preprocess.resize(preprocess.decode_image(ex['image'], d.channels), d.image_size) / 255.0
  )
  x = np.stack(list(ds.take(512).map(fn).as_numpy_iterator())).reshape(-1, d.channels)
  return x.mean(0).astype(np.float32), np.maximum(x.std(0), 1e-3).astype(np.float32)


class Source:
  """One split of a TFDS dataset or ImageFolder, as this process's shard of records.

  `dataset(shuffle_seed)` yields raw examples with the input feature left
  encoded (images are decoded later, after any skipping).
  """

  def __init__(
    self,
    dataset: specs.Dataset,
    split: str,
    process_index: int,
    process_count: int,
    drop_remainder: bool,
  ):
    spec = dataset.spec
    self.spec = spec
    self.folder = dataset.source == 'folder'
    self.split = split
    self.process_index, self.process_count = process_index, process_count
    self.drop_remainder = drop_remainder
    if self.folder:
      self.builder = tfds.ImageFolder(dataset.fields.data_dir)
    else:
      self.builder = tfds.builder(spec.name, data_dir=dataset.fields.data_dir or None)
    self.feature = 'image' if self.folder else spec.feature
    self.decoders = {self.feature: tfds.decode.SkipDecoding()} if spec.kind == 'image' else None
    self.num_examples = self._count()

  def _count(self) -> int:
    try:
      return int(self.builder.info.splits[self.split].num_examples)
    except (KeyError, ValueError, TypeError):  # no split info (e.g. tfds.testing.mock_data)
      ds = self._read(None, shard=False)
      return int(ds.reduce(np.int64(0), lambda n, _: n + 1).numpy())

  def _read(self, shuffle_seed: Optional[int], shard: bool = True) -> tf.data.Dataset:
    if self.folder:
      ds = self.builder.as_dataset(split=self.split, shuffle_files=False, decoders=self.decoders)
      if shard and self.process_count > 1:
        ds = ds.shard(self.process_count, self.process_index)
      if shuffle_seed is not None:  # ImageFolder has one "file": shuffle the paths
        ds = ds.shuffle(self.num_examples, seed=shuffle_seed, reshuffle_each_iteration=False)
      return ds.with_options(_read_config(None).options)
    split = self.split
    if shard and self.process_count > 1:
      split = tfds.even_splits(split, self.process_count, drop_remainder=self.drop_remainder)[
        self.process_index
      ]
    return self.builder.as_dataset(
      split=split,
      shuffle_files=shuffle_seed is not None,
      decoders=self.decoders,
      read_config=_read_config(shuffle_seed),
    )

  def dataset(self, shuffle_seed: Optional[int] = None) -> tf.data.Dataset:
    return self._read(shuffle_seed)


def _example_fn(dataset: specs.Dataset, source: Source, train: bool):
  """(seed `[2]`, raw example) -> {'inputs', 'label'} for the model."""
  d, kind = dataset.fields, dataset.input_kind
  norm = None
  if kind == 'image':
    norm = specs.normalization(dataset) or _folder_normalization(dataset)
  feature = source.feature

  def fn(seed, example):
    if kind == 'text':
      inputs = preprocess.byte_tokens(example[feature], d.max_length)
    elif kind == 'pixels':
      inputs = preprocess.pixel_tokens(example[feature], size=d.image_size, channels=d.channels)
    else:
      inputs = preprocess.image_example(
        example[feature],
        size=d.image_size,
        channels=d.channels,
        augment=d.augment,
        train=train,
        mean=norm[0],
        std=norm[1],
        seed=seed,
      )
    return {
      'inputs': inputs,
      'label': tf.cast(example['label'], tf.int32),
      'mask': tf.constant(1.0, tf.float32),
    }

  return fn


class TrainData:
  """Endless shuffled, augmented training batches of this process."""

  def __init__(self, dataset: specs.Dataset, process_index: int, process_count: int):
    self.shuffle_buffer = dataset.fields.shuffle_buffer
    self.source = Source(
      dataset, dataset.fields.train_split, process_index, process_count, drop_remainder=True
    )
    self.num_examples = self.source.num_examples
    self.global_batch = dataset.fields.batch_size
    self.local_batch = specs.local_batch_size(self.global_batch, process_count, 'batch_size')
    self.local_examples = self.num_examples // process_count
    self.steps_per_epoch = self.local_examples // self.local_batch
    if self.steps_per_epoch == 0:
      raise ValueError(
        f'config.dataset.batch_size={self.global_batch} exceeds the '
        f'{self.num_examples} examples of split {self.source.split!r}'
      )
    self.seed, self.process_index = dataset.seed, process_index
    self._fn = _example_fn(dataset, self.source, train=True)

  def epoch_dataset(self, epoch: int, skip_batches: int = 0) -> tf.data.Dataset:
    """Batches of one epoch, starting after its first `skip_batches` batches."""
    seed = epoch_seed(self.seed, epoch, self.process_index)
    ds = self.source.dataset(shuffle_seed=seed)
    ds = ds.take(self.steps_per_epoch * self.local_batch)
    ds = ds.shuffle(self.shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
    ds = ds.enumerate()
    ds = ds.skip(skip_batches * self.local_batch)
    fn = self._fn
    ds = ds.map(
      lambda i, ex: fn(tf.stack([tf.constant(seed, tf.int64), i]), ex),
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True,
    )
    ds = ds.batch(self.local_batch, drop_remainder=True)
    return ds.prefetch(tf.data.AUTOTUNE)

  def batches(self, start_step: int = 0):
    epoch, skip = divmod(start_step, self.steps_per_epoch)
    if skip:
      logging.info(
        'Input: resuming at step %d = epoch %d + %d batches (skipping %d undecoded records)',
        start_step,
        epoch,
        skip,
        skip * self.local_batch,
      )
    for e in itertools.count(epoch):
      yield from self.epoch_dataset(e, skip if e == epoch else 0).as_numpy_iterator()


class EvalData:
  """Every example of a split once over all processes, in order, in batches of
  `specs.eval_local_batch` rows (padded with mask-0 rows)."""

  def __init__(
    self,
    dataset: specs.Dataset,
    split: str,
    process_index: int,
    process_count: int,
    row_multiple: int = 1,
  ):
    self.source = Source(dataset, split, process_index, process_count, drop_remainder=False)
    self.num_examples = self.source.num_examples
    self.local_batch = specs.eval_local_batch(
      dataset.fields.eval_batch_size, process_count, row_multiple
    )
    per_process = -(-self.num_examples // process_count)
    self.num_batches = -(-per_process // self.local_batch)
    fn = _example_fn(dataset, self.source, train=False)
    ds = self.source.dataset()
    ds = ds.map(lambda ex: fn(None, ex), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    self._dataset = ds.batch(self.local_batch).prefetch(tf.data.AUTOTUNE)

  def batches(self):
    it = self._dataset.as_numpy_iterator()
    template = None
    for _ in range(self.num_batches):
      batch = next(it, None)
      if batch is None:  # this process ran out: an all-padding batch
        batch = {k: v[:0] for k, v in template.items()}
      template = batch
      yield {k: specs.pad_rows(v, self.local_batch) for k, v in batch.items()}


def prepare(dataset: specs.Dataset) -> None:
  """Checks the data exists, downloading/preparing it through TFDS when allowed."""
  d, spec = dataset.fields, dataset.spec
  if dataset.source == 'folder':
    if not d.data_dir or not tf.io.gfile.isdir(d.data_dir):
      raise ValueError(
        f'config.dataset.data_dir={d.data_dir!r} is not a directory; '
        f"source 'folder' needs the image folder root "
        f'(root/<split>/<label>/<image>)'
      )
    classes = folder_num_classes(d.data_dir)
    if spec.num_classes and classes > spec.num_classes:
      raise ValueError(
        f'config.dataset.data_dir={d.data_dir!r} has {classes} label folders, '
        f'more than the {spec.num_classes} classes of dataset {d.name!r}'
      )
    splits = sorted(tf.io.gfile.listdir(d.data_dir))
    splits = [s.rstrip('/') for s in splits]
    for field in ('train_split', 'eval_split'):
      if d[field] not in splits:
        raise ValueError(
          f'config.dataset.{field}={d[field]!r} is not a folder of '
          f'{d.data_dir}; valid choices: {", ".join(splits)}'
        )
    return
  builder = tfds.builder(spec.name, data_dir=d.data_dir or None)
  if _is_prepared(builder):
    return
  where = f'config.dataset.data_dir={d.data_dir!r}' + (' (TFDS default)' if not d.data_dir else '')
  if not d.download:
    raise ValueError(
      f'dataset {spec.name!r} is not prepared in {where}; set '
      f'config.dataset.data_dir to a directory holding it, or '
      f'config.dataset.download=True to let TFDS download it'
    )
  if spec.manual and not d.manual_dir:
    raise ValueError(
      f'dataset {spec.name!r} is not prepared in {where} and TFDS can only '
      f'prepare it from manually downloaded files: set '
      f'config.dataset.manual_dir to the directory holding them'
    )
  download_config = tfds.download.DownloadConfig(manual_dir=d.manual_dir or None)
  if jax.process_index() == 0:
    logging.info('Preparing TFDS dataset %r in %s', spec.name, builder.data_dir)
    _download_and_prepare(builder, download_config)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    multihost_utils.sync_global_devices('tfds_prepare')
    if not _is_prepared(builder):  # hosts without a shared filesystem prepare their own
      _download_and_prepare(builder, download_config)


OFFLINE_HINT = "see README 'Data' for offline use"
CONNECT_TIMEOUT_S = 5.0  # a server that answers takes well under a second


def download_hosts(builder) -> List[Tuple[str, int]]:
  """(host, port) of each server `builder` downloads from (the URLs of its TFDS
  checksums file), or of the proxy that reaches it; [] when TFDS lists no URLs."""
  hosts = []
  for url in sorted(getattr(builder, 'url_infos', None) or ()):
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ''):
      parts = urllib.parse.urlsplit(proxy if '://' in proxy else f'http://{proxy}')
    if parts.hostname:
      host = (parts.hostname, parts.port or (443 if parts.scheme == 'https' else 80))
      hosts += [host] if host not in hosts else []
  return hosts


def unreachable(
  hosts: Iterable[Tuple[str, int]], timeout: float = CONNECT_TIMEOUT_S
) -> Optional[str]:
  """'host:port' of the first of `hosts` no TCP connection reaches within `timeout`
  seconds in all (name lookup included, which has no timeout of its own), or None."""
  hosts = list(hosts)
  reached = set()

  def connect(host):
    try:
      socket.create_connection(host, timeout=timeout).close()
      reached.add(host)
    except OSError:
      pass

  threads = [threading.Thread(target=connect, args=(h,), daemon=True) for h in hosts]
  for t in threads:
    t.start()
  deadline = time.monotonic() + timeout
  for t in threads:
    t.join(max(0.0, deadline - time.monotonic()))
  return next((f'{h}:{p}' for h, p in hosts if (h, p) not in reached), None)


def check_network(builder, timeout: float = CONNECT_TIMEOUT_S) -> None:
  """DownloadError within `timeout` seconds when a server `builder` downloads from cannot
  be reached, instead of TFDS's ten retries (about three and a half minutes)."""
  where = unreachable(download_hosts(builder), timeout)
  if where:
    raise DownloadError(
      f'could not download {builder.name}: no network ({where} cannot be reached); {OFFLINE_HINT}'
    )


def _no_network(error: BaseException) -> bool:
  """Whether `error` (or one it was raised from) says the network cannot be reached."""
  import urllib.error  # pylint: disable=g-import-not-at-top

  import requests  # pylint: disable=g-import-not-at-top  (a TFDS dependency)

  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(
      error,
      (
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        urllib.error.URLError,
        ConnectionError,
        TimeoutError,
        socket.gaierror,
      ),
    ):
      return True
    error = error.__cause__ or error.__context__
  return False


def _download_and_prepare(builder, download_config) -> None:
  """builder.download_and_prepare, a failed download raised as one line (DownloadError):
  at once (`check_network`) when its servers cannot be reached."""
  check_network(builder)
  try:
    builder.download_and_prepare(download_config=download_config)
  except Exception as e:  # pylint: disable=broad-except
    message = ' '.join(str(e).split()) or type(e).__name__
    if _no_network(e):
      message = f'could not download {builder.name}: no network; {OFFLINE_HINT}'
    elif type(e).__module__.split('.')[0] in ('requests', 'urllib3'):  # an HTTP error
      message = f'could not download {builder.name}: {message}; {OFFLINE_HINT}'
    elif isinstance(e, OSError):  # the disk
      message = f'could not prepare {builder.name} in {builder.data_dir}: {message}'
    else:
      raise
    raise DownloadError(message) from e


def _is_prepared(builder) -> bool:
  return tf.io.gfile.exists(builder.data_dir) and bool(
    tf.io.gfile.glob(f'{builder.data_dir}/dataset_info.json')
  )

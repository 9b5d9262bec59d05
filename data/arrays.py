"""Reading small datasets into memory once: `.npz` files, TFDS, scikit-learn digits.

    splits = arrays.load(config)     # {split: Examples}, decoded, cached per process
    x, y = splits['train'].inputs, splits['train'].labels

`.npz` files ('arrays' source) hold one split each and may use these keys:

  * labels: `y` (or `label`, `labels`), int `[n]` (any integer dtype, >= 0;
    float labels are refused, not truncated);
  * images: `x` (or `image`, `images`), uint8 `[n, h, w]` or `[n, h, w, c]`;
  * encoded images: `jpeg` (or `png`, `encoded`) with `offsets` `[n + 1]`:
    image i is the file `jpeg[offsets[i]:offsets[i + 1]]` (PNG or JPEG bytes);
  * text: `text_utf8` (or `text`) with `offsets` `[n + 1]`: UTF-8 bytes;
  * tokens: `tokens`, int `[n, length]` (generated token tasks, 0 = padding);
  * sequence labelling (datasets of kind 'sequence': mqar, sequences): `inputs`
    and `labels`, int `[n, length]`, label -100 = not scored; see `sequences.py`.

`dataset.data_dir` is the file, e.g. `mnist_train.npz`; a '{split}' in it
names one file per split (`mnist_{split}.npz`), otherwise the file is the
'train' split. Files are read through `files.gfile` (`tf.io.gfile` for a URL), so
a `gs://` path works as a local one does. `dataset.holdout` > 0 carves a fixed, class-stratified
validation split out of 'train' ('train' keeps the rest), the same for every
seed and process.

Checks, each a ValueError naming the file (or dataset): a file that is not a
readable `.npz` (empty, truncated), labels that are not integers, and, through
`check_split` / `check_labels` (called by `train.validate` before any workdir
is written), a split with no examples or labels outside 0..num_classes-1.

Everything is decoded here, once: encoded images to uint8 pixels, text to
bytes. The results are cached for the life of the process, so the training
and evaluation pipelines (and a resumed run) share one decoded copy.
"""

import dataclasses
import functools
import importlib.metadata
import os
from typing import Dict, Optional, Tuple
import zipfile
import zlib

import numpy as np

from data import cache_folder
from data import files
from data import npz_cache
from data import sequences
from data import specs
from data.examples import Examples  # also arrays.Examples, as before

LABEL_KEYS = ('y', 'label', 'labels')
IMAGE_KEYS = ('x', 'image', 'images')
ENCODED_KEYS = ('jpeg', 'png', 'encoded')
TEXT_KEYS = ('text_utf8', 'text')
HOLDOUT_SEED = 0  # the validation split is fixed, whatever the training seed


def check_split(examples: Examples, what: str) -> None:
  """ValueError naming `examples.origin` if the split has no examples; `what` names
  the field that chose it (e.g. "config.dataset.eval_split='test'")."""
  if not len(examples):
    raise ValueError(
      f'{examples.origin} holds no examples ({what}); a run needs at least '
      f'one in every split it reads'
    )


def check_labels(examples: Examples, num_classes: int, classes: str) -> None:
  """ValueError naming `examples.origin` if a label is outside 0..num_classes-1;
  `classes` says where num_classes comes from."""
  labels = examples.labels
  bad = (labels < 0) | (labels >= num_classes)
  if np.any(bad):
    raise ValueError(
      f'{examples.origin}: labels must be in 0..{num_classes - 1} ({classes}), '
      f'got {labels[bad][0]} ({int(bad.sum())} of {len(labels)} labels)'
    )


def _first(npz, keys, path: str, what: str, required: bool = True) -> Optional[str]:
  for key in keys:
    if key in npz.files:
      return key
  if required:
    raise ValueError(
      f'{path} has no {what} array; expected one of the keys '
      f'{", ".join(keys)} (it has {", ".join(npz.files)})'
    )
  return None


def _ragged(data: np.ndarray, offsets: np.ndarray, path: str):
  offsets = np.asarray(offsets, np.int64)
  if (
    offsets.ndim != 1 or offsets[0] != 0 or offsets[-1] != len(data) or np.any(np.diff(offsets) < 0)
  ):
    raise ValueError(
      f'{path}: offsets must rise from 0 to the length of the data '
      f'({len(data)}), got {offsets[:3]}...{offsets[-2:]}'
    )
  raw = data.tobytes()
  return [raw[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def decode_images(files, channels: int = 0) -> np.ndarray:
  """Encoded PNG/JPEG files (bytes) -> uint8 `[n, h, w, c]` (all the same size)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  images = [
    tf.io.decode_image(f, channels=channels, expand_animations=False).numpy() for f in files
  ]
  shapes = {im.shape for im in images}
  if len(shapes) > 1:
    raise ValueError(
      f'encoded images have different shapes {sorted(shapes)[:4]}; the arrays source needs one size'
    )
  return np.stack(images) if images else np.zeros((0, 1, 1, max(channels, 1)), np.uint8)


def read_npz(path: str, parse=None) -> Examples:
  """One split from an `.npz` file (see the module docstring for the keys); `parse(npz,
  path)` reads another format from the open archive (`sequences.parse`)."""
  gfile = files.gfile(path)
  if not gfile.exists(path) or gfile.isdir(path):
    raise ValueError(f'config.dataset.data_dir={path!r}: no such file')
  damaged = (EOFError, zipfile.BadZipFile, zlib.error) + files.read_errors(path)
  with gfile.GFile(path, 'rb') as f:
    head = f.read(2)
    f.seek(0)
    try:
      if head != b'PK':  # an .npz is a zip archive
        raise ValueError('an empty file' if not head else 'not a zip archive')
      npz = np.load(f, allow_pickle=False)
    except damaged + (ValueError,) as e:
      raise ValueError(f'{path} is not a readable .npz file ({_first_line(e)})') from None
    try:
      with npz:
        return (parse or _read_npz)(npz, path)
    except damaged as e:  # damaged array data
      raise ValueError(f'{path} is not a readable .npz file ({_first_line(e)})') from None


def _first_line(error: BaseException) -> str:
  text = str(getattr(error, 'message', '') or error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def _read_npz(npz, path: str) -> Examples:
  """`read_npz` of an open archive."""
  key = _first(npz, LABEL_KEYS, path, 'label')
  labels = np.asarray(npz[key])
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(
      f'{path}: labels {key!r} must be integers [n], got {labels.dtype} '
      f'{list(labels.shape)}'
      + (
        '; store whole-number labels as ints (.astype(np.int64))'
        if np.issubdtype(labels.dtype, np.floating)
        else ''
      )
    )
  if labels.size and (
    labels.min() < np.iinfo(np.int32).min or labels.max() > np.iinfo(np.int32).max
  ):
    raise ValueError(f'{path}: labels {key!r} must fit int32, got {labels.min()}..{labels.max()}')
  labels = labels.astype(np.int32)
  image = _first(npz, IMAGE_KEYS, path, 'input', required=False)
  encoded = _first(npz, ENCODED_KEYS, path, 'input', required=False)
  text = _first(npz, TEXT_KEYS, path, 'input', required=False)
  if image is not None:
    inputs = np.asarray(npz[image])
    if inputs.ndim == 3:
      inputs = inputs[..., None]
    if inputs.ndim != 4 or inputs.dtype != np.uint8:
      raise ValueError(
        f'{path}: {image!r} must be uint8 [n, h, w] or [n, h, w, c], got '
        f'{inputs.dtype} {inputs.shape}'
      )
  elif encoded is not None or text is not None:
    if 'offsets' not in npz.files:
      raise ValueError(f'{path}: {encoded or text!r} needs an offsets array [n + 1]')
    blobs = _ragged(npz[encoded or text], npz['offsets'], path)
    inputs = decode_images(blobs) if encoded is not None else blobs
  elif 'tokens' in npz.files:
    inputs = np.asarray(npz['tokens'])
  else:
    raise ValueError(
      f'{path} has no inputs; expected one of the keys '
      f'{", ".join(IMAGE_KEYS + ENCODED_KEYS + TEXT_KEYS)} or tokens '
      f'(it has {", ".join(npz.files)})'
    )
  if len(inputs) != len(labels):
    raise ValueError(f'{path}: {len(inputs)} inputs but {len(labels)} labels')
  return Examples(inputs, labels, path)


def holdout_split(
  labels: np.ndarray, fraction: float, seed: int = HOLDOUT_SEED
) -> Tuple[np.ndarray, np.ndarray]:
  """(train indices, validation indices): a fixed class-stratified split.

  Each class is shuffled with `seed` and its last share goes to validation;
  the shares are rounded so that the validation split has round(n * fraction)
  examples in all (largest remainders first). Both index arrays are sorted.
  """
  n = len(labels)
  total = int(round(n * fraction))
  classes, counts = np.unique(labels, return_counts=True)
  exact = counts * fraction
  take = np.floor(exact).astype(int)
  order = np.argsort(-(exact - take), kind='stable')
  take[order[: total - take.sum()]] += 1
  rng = np.random.default_rng(seed)
  val = []
  for c, k in zip(classes, take):
    idx = rng.permutation(np.flatnonzero(labels == c))
    val.append(idx[len(idx) - k :])
  val = np.sort(np.concatenate(val)) if val else np.zeros((0,), np.int64)
  train = np.setdiff1d(np.arange(n), val)
  return train, val


def _carve(splits: Dict[str, Examples], holdout: float, where: str) -> Dict[str, Examples]:
  if holdout <= 0:
    return splits
  if 'validation' in splits:
    raise ValueError(
      f'config.dataset.holdout={holdout} carves a validation split, but '
      f'{where} already has one; set holdout=0'
    )
  if 'train' not in splits:
    raise ValueError(f'config.dataset.holdout={holdout}: {where} has no train split')
  train, val = holdout_split(splits['train'].labels, holdout)
  validation = dataclasses.replace(
    splits['train'].take(val),
    origin=(f'{splits["train"].origin} (its validation split, dataset.holdout={holdout})'),
  )
  return dict(splits, train=splits['train'].take(train), validation=validation)


def _npz_splits(pattern: str, parse=None) -> Dict[str, Examples]:
  if '{split}' not in pattern:
    return {'train': read_npz(pattern, parse)}
  head, tail = pattern.split('{split}', 1)
  folder = os.path.dirname(head) or '.'
  gfile = files.gfile(folder)
  if not gfile.isdir(folder):
    raise ValueError(f'config.dataset.data_dir={pattern!r}: no folder {folder!r}')
  splits = {}
  for entry in sorted(gfile.listdir(folder)):
    path = os.path.join(folder, entry.rstrip('/'))
    if path.startswith(head) and path.endswith(tail) and len(path) > len(head) + len(tail):
      splits[path[len(head) : len(path) - len(tail)]] = read_npz(path, parse)
  if not splits:
    raise ValueError(f'config.dataset.data_dir={pattern!r} matches no file')
  return splits


def _tfds_splits(name: str, data_dir: str, feature: str, splits) -> Dict[str, Examples]:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  builder = tfds.builder(name, data_dir=data_dir or None)
  out = {}
  for split in splits:
    ds = builder.as_dataset(split=split, shuffle_files=False).batch(4096)
    parts = list(tfds.as_numpy(ds))
    inputs = np.concatenate([p[feature] for p in parts]) if parts else np.zeros((0,))
    labels = np.concatenate([p['label'] for p in parts]) if parts else np.zeros((0,))
    if inputs.dtype == object:  # text
      inputs = [bytes(t) for t in inputs]
    out[split] = Examples(inputs, np.asarray(labels, np.int32), f'TFDS {name!r} split {split!r}')
  return out


def load_digits() -> Dict[str, Examples]:
  """scikit-learn's 1797 8x8 digits, 20% held out (stratified, fixed): 1437 / 360.

  The 17 intensities 0..16 are rescaled to v * 255 / 16 (float32, exact). The split is
  kept in the cache folder, named by scikit-learn's version, so that a run reads it
  without importing scikit-learn (~1.5 s); a cache that cannot be written is skipped
  with a line saying so.
  """
  settings = dict(
    dataset='digits',
    scikit_learn=importlib.metadata.version('scikit-learn'),
    test_size=0.2,
    stratify=True,
    random_state=0,
    scale='255/16',
  )
  path = os.path.join(
    cache_folder.cache_dir('digits'),
    f"digits_sklearn{settings['scikit_learn']}_{npz_cache.settings_key(settings)}.npz",
  )
  names = ('x_train', 'y_train', 'x_test', 'y_test')
  why = npz_cache.problem(path, settings)
  if why:
    arrays = dict(zip(names, _split_digits()))
    try:
      npz_cache.makedirs(os.path.dirname(path))
      npz_cache.save_npz(path, **arrays, settings_json=npz_cache.settings_json(settings))
      npz_cache.report_written(path, why, 'the digits split written')
    except files.read_errors(path) as e:  # the same errors when writing
      print(f'{path}: the digits split is not cached ({type(e).__name__}: {e})', flush=True)
  else:
    arrays = {name: npz_cache.read_array(path, name) for name in names}
  return {
    'train': Examples(arrays['x_train'], arrays['y_train'], "scikit-learn's digits (train)"),
    'test': Examples(arrays['x_test'], arrays['y_test'], "scikit-learn's digits (test)"),
  }


def _split_digits():
  """(x_train, y_train, x_test, y_test) from scikit-learn (see `load_digits`)."""
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top

  digits = sk_datasets.load_digits()
  images = (digits.images * (255.0 / 16.0)).astype(np.float32)[..., None]
  labels = digits.target.astype(np.int32)
  x_train, x_test, y_train, y_test = model_selection.train_test_split(
    images, labels, test_size=0.2, stratify=labels, random_state=0
  )
  return x_train, y_train, x_test, y_test


@functools.lru_cache(maxsize=4)
def _load(
  source: str, name: str, data_dir: str, holdout: float, tfds_splits: Tuple[str, ...]
) -> Dict[str, Examples]:
  if source == 'arrays':
    if not data_dir:
      raise ValueError(
        "config.dataset.source='arrays' needs config.dataset.data_dir: the "
        ".npz file (a '{split}' in it names one file per split)"
      )
    parse = None
    if specs.get_spec(name).kind == 'sequence':  # inputs and labels [n, length]
      parse = sequences.parse
    return _carve(_npz_splits(data_dir, parse), holdout, data_dir)
  if source == 'sklearn':
    return _carve(load_digits(), holdout, 'the digits')
  if source == 'tsv':
    from data import aan  # pylint: disable=g-import-not-at-top

    return _carve(
      {
        split: Examples(
          list(zip(a, b)), np.asarray(y, np.int32), os.path.join(data_dir, aan.SPLIT_FILES[split])
        )
        for split, (a, b, y) in aan.read_splits(data_dir).items()
      },
      holdout,
      data_dir,
    )
  if source == 'tfds':
    spec = specs.get_spec(name)
    return _carve(
      _tfds_splits(name, data_dir, spec.feature, tfds_splits), holdout, f'TFDS {name!r}'
    )
  raise ValueError(f'source {source!r} is not read by data.arrays')


def clear_cache() -> None:
  """Forgets every dataset read so far (the next `load` reads again)."""
  _load.cache_clear()


def load(config) -> Dict[str, Examples]:
  """{split: Examples} of an in-memory dataset (decoded once per process); `config` or its
  resolved `specs.Dataset`."""
  dataset = specs.resolve(config)
  d, src = dataset.fields, dataset.source
  if src == 'generated':  # written once into data_dir, then read as .npz files
    from data import generated  # pylint: disable=g-import-not-at-top

    return _load('arrays', d.name, generated.ensure(dataset), float(d.get('holdout', 0.0)), ())
  wanted = ()
  if src == 'tfds':  # TFDS reads only the splits the run uses
    base = ('train',) if d.get('holdout', 0.0) > 0 else ()
    wanted = tuple(
      sorted(
        set(base) | {s for s in (d.train_split, d.eval_split) if s != 'validation' or not base}
      )
    )
  return _load(src, d.name, d.data_dir, float(d.get('holdout', 0.0)), wanted)


def get_split(config, split: str) -> Examples:
  """The examples of `split` (`config`: a config or its resolved `specs.Dataset`)."""
  dataset = specs.resolve(config)
  splits = load(dataset)
  if split not in splits:
    raise ValueError(
      f'config.dataset split {split!r} is not valid for dataset '
      f'{dataset.fields.name!r} from {dataset.source!r}; valid '
      f'choices: {", ".join(sorted(splits))}'
      + ('' if 'validation' in splits else ' (config.dataset.holdout > 0 adds a validation split)')
    )
  return splits[split]

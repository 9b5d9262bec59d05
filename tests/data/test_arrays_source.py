"""Training on data you already have: `.npz` arrays, image folders with any model config."""

import numpy as np
import pytest

from configs import common
from configs import imdb as imdb_config
from configs import mnist as mnist_config
from configs import presets
import data
from data import arrays
from data import memory
from train import validate


def _encode(images, fmt):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  encode = tf.io.encode_png if fmt == 'png' else tf.io.encode_jpeg
  files = [encode(im).numpy() for im in images]
  offsets = np.cumsum([0] + [len(f) for f in files])
  return np.frombuffer(b''.join(files), np.uint8), offsets


@pytest.fixture(scope='module')
def npz_files(tmp_path_factory):
  """MNIST-like raw images, CIFAR-like PNG files, IMDB-like text, all with labels."""
  root = tmp_path_factory.mktemp('arrays')
  rng = np.random.default_rng(0)
  labels = np.repeat(np.arange(10), 10)  # 10 per class
  mnist = rng.integers(0, 256, (100, 28, 28), dtype=np.uint8)
  np.savez(root / 'mnist_train.npz', x=mnist, y=labels)
  np.savez(root / 'mnist_test.npz', x=mnist[:20], y=labels[:20])
  rgb = rng.integers(0, 256, (100, 32, 32, 3), dtype=np.uint8)
  data, offsets = _encode(rgb, 'png')
  np.savez(root / 'cifar.npz', png=data, offsets=offsets, y=labels)
  texts = [f'review {i} '.encode() + bytes([200 + i % 50]) * (i % 7) for i in range(40)]
  np.savez(
    root / 'imdb.npz',
    text_utf8=np.frombuffer(b''.join(texts), np.uint8),
    offsets=np.cumsum([0] + [len(t) for t in texts]),
    y=np.arange(40) % 2,
  )
  return root, mnist, rgb, labels, texts


def _mnist(path, **dataset):
  config = mnist_config.get_config('standard')
  config.dataset.update(
    dict(source='arrays', data_dir=str(path), batch_size=8, eval_batch_size=16, **dataset)
  )
  return config


def test_holdout_is_fixed_stratified_and_exact():
  labels = np.concatenate(
    [
      np.full(n, c)
      for c, n in enumerate([5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])
    ]
  )
  train, val = arrays.holdout_split(labels, 0.1)
  assert len(val) == 6000 and len(train) == 54_000
  assert not set(train) & set(val)
  counts = np.bincount(labels[val], minlength=10)
  assert np.all(np.abs(counts - 0.1 * np.bincount(labels)) < 1)  # stratified
  np.testing.assert_array_equal(arrays.holdout_split(labels, 0.1)[1], val)  # fixed


def test_mnist_config_on_npz_with_a_carved_validation_split(npz_files):
  root, mnist, _, labels, _ = npz_files
  config = _mnist(root / 'mnist_train.npz', holdout=0.2, eval_split='validation')
  validate.validate_config(config)
  data.prepare(config)
  train = data.get_train_data(config)
  evals = data.get_eval_data(config)
  assert train.num_examples == 80 and evals.num_examples == 20
  batch = next(train.batches(0))
  assert batch['inputs'].shape == (8, 32, 32, 1) and batch['inputs'].dtype == np.float32
  val = arrays.get_split(config, 'validation')
  np.testing.assert_array_equal(np.bincount(val.labels), np.full(10, 2))
  # the validation images are real MNIST rows, resized once like the TFDS path does
  first = np.asarray(val.inputs[0], np.float32)
  assert any(np.array_equal(first, m[..., None]) for m in mnist)
  x = next(evals.batches())['inputs'][0]
  mean, std = 0.1307, 0.3081
  assert abs(float(x.mean()) - (memory._resize(first[None], 32).mean() / 255 - mean) / std) < 1e-4


def test_split_pattern_and_clear_errors(npz_files):
  root = npz_files[0]
  config = _mnist(root / 'mnist_{split}.npz')
  assert data.get_eval_data(config).num_examples == 20
  config = _mnist(root / 'mnist_train.npz')  # eval_split 'test' does not exist
  with pytest.raises(ValueError, match=r"split 'test' is not valid.*train.*holdout"):
    data.get_eval_data(config)
  with pytest.raises(ValueError, match=r"data_dir=.*nope.npz.*no such file"):
    data.get_train_data(_mnist(root / 'nope.npz'))
  bad = _mnist(root / 'mnist_train.npz', holdout=1.5)
  with pytest.raises(validate.ConfigError, match=r'holdout=1.5 .*\[0, 1\)'):
    validate.validate_config(bad)


_X = np.zeros((20, 28, 28), np.uint8)
_Y = np.arange(20) % 10


@pytest.mark.parametrize(
  'train,test,message',
  [
    # each used to train or evaluate quietly (accuracy 0.0 and a NaN loss, truncated
    # labels), to stop with "non-finite training loss", or with a traceback
    (
      _Y,
      np.full(20, 10),
      r'mnist_test.npz: labels must be in 0..9 \(config.dataset.'
      r'num_classes=10\), got 10 \(20 of 20 labels\)',
    ),
    (_Y - 1, _Y, r'mnist_train.npz: labels must be in 0..9 .*got -1 \(2 of 20'),
    (_Y + 0.5, _Y, r"mnist_train.npz: labels 'y' must be integers \[n\], got float64"),
    (np.where(_Y == 3, 12, _Y), _Y, r'mnist_train.npz: labels must be in 0..9 .*got 12'),
    (_Y, _Y[:0], r"mnist_test.npz holds no examples \(config.dataset.eval_split='test'\)"),
    (b'', _Y, r'mnist_train.npz is not a readable .npz file \(an empty file\)$'),
    (b'PK\x03\x04 cut short', _Y, r'mnist_train.npz is not a readable .npz file'),
  ],
)
def test_bad_labels_and_unreadable_files_are_refused_before_any_work(
  tmp_path, train, test, message
):
  from train import trainer  # pylint: disable=g-import-not-at-top

  for split, labels in (('train', train), ('test', test)):
    if isinstance(labels, bytes):
      (tmp_path / f'mnist_{split}.npz').write_bytes(labels)
    else:
      np.savez(tmp_path / f'mnist_{split}.npz', x=_X[: len(labels)], y=labels)
  config = _mnist(tmp_path / 'mnist_{split}.npz')
  with pytest.raises(validate.ConfigError, match=message) as e:
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert '\n' not in str(e.value) and not (tmp_path / 'run').exists()


def test_npz_files_are_read_through_gfile(npz_files):
  """A bucket path (here TF's in-memory ram:// file system) reads like a local one."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  root, mnist, _, labels, _ = npz_files
  folder = 'ram://arrays_gfile_test'
  for split in ('train', 'test'):
    tf.io.gfile.makedirs(folder)
    tf.io.gfile.copy(
      str(root / f'mnist_{split}.npz'), f'{folder}/mnist_{split}.npz', overwrite=True
    )
  config = _mnist(f'{folder}/mnist_{{split}}.npz')
  train = arrays.get_split(config, 'train')
  np.testing.assert_array_equal(train.labels, labels)
  np.testing.assert_array_equal(np.asarray(train.inputs)[..., 0], mnist)
  assert len(arrays.get_split(config, 'test').labels) == 20
  with pytest.raises(ValueError, match=r"data_dir='ram://arrays_gfile_test/nope.npz'.*no such"):
    arrays.get_split(_mnist(f'{folder}/nope.npz'), 'train')


def test_encoded_images_are_decoded_once_and_augmented_deterministically(npz_files, monkeypatch):
  root, _, rgb, labels, _ = npz_files
  config = presets.cifar10(common.base())
  config.dataset.update(
    dict(
      source='arrays',
      data_dir=str(root / 'cifar.npz'),
      batch_size=10,
      holdout=0.1,
      eval_split='validation',
    )
  )
  calls = []
  original = arrays.decode_images
  monkeypatch.setattr(arrays, 'decode_images', lambda f, c=0: calls.append(1) or original(f, c))
  arrays.clear_cache()
  a = next(data.get_train_data(config).batches(3))
  b = next(data.get_train_data(config).batches(3))
  data.get_eval_data(config)
  assert len(calls) == 1  # decoded once per process
  np.testing.assert_array_equal(a['inputs'], b['inputs'])  # crop/flip: a function of the step
  val = arrays.get_split(config, 'validation')
  np.testing.assert_array_equal(
    val.inputs[0], rgb[np.flatnonzero(np.all(rgb == val.inputs[0], axis=(1, 2, 3)))[0]]
  )  # PNG is lossless


def test_crop_flip_keeps_shape_and_content():
  rng = np.random.default_rng(0)
  images = rng.integers(1, 256, (16, 8, 8, 1)).astype(np.uint8)
  out = memory.crop_flip(images, np.random.default_rng(1), flip=True)
  assert out.shape == images.shape and out.dtype == images.dtype
  same = [np.array_equal(image_out, i) for image_out, i in zip(out, images)]
  assert not all(same)
  # a crop shifts by at most 1 pixel (8 // 8) each way: at least 7 x 7 pixels survive
  for image_out in out:
    assert np.sum(image_out > 0) >= 7 * 7
  centred = memory.crop_flip(images, np.random.default_rng(1), flip=False)
  assert not np.array_equal(centred, out)


def test_imdb_text_from_npz(npz_files):
  root, _, _, _, texts = npz_files
  config = imdb_config.get_config('linear,max_length=16')
  config.dataset.update(
    dict(
      source='arrays',
      data_dir=str(root / 'imdb.npz'),
      batch_size=4,
      eval_batch_size=8,
      holdout=0.25,
      eval_split='validation',
    )
  )
  validate.validate_config(config)
  batch = next(data.get_eval_data(config).batches())
  assert batch['inputs'].shape == (8, 16) and batch['inputs'].dtype == np.int32
  ids = memory.byte_ids([texts[1]], 16)[0]
  assert ids[0] == ord('r') + 1 and ids[-1] == 0


def test_mnist_vit_on_a_folder_of_grayscale_pngs(tmp_path, image_folder_root):
  """The MNIST model on a folder: two overrides, one channel, no flips, measured norm."""
  from conftest import write_image_folder  # pylint: disable=g-import-not-at-top

  digits = write_image_folder(
    str(tmp_path / 'digits'), splits=(('train', 1), ('test', 1)), labels=tuple('0123456789')
  )
  config = mnist_config.get_config('standard')
  config.dataset.update(dict(source='folder', data_dir=digits, batch_size=4, eval_batch_size=4))
  validate.validate_config(config)
  data.prepare(config)
  assert config.dataset.augment == 'none' and config.dataset.channels == 1
  batch = next(data.get_train_data(config).batches(0))
  assert batch['inputs'].shape == (4, 32, 32, 1)
  config.dataset.data_dir = image_folder_root  # 2 label folders: fine for 10 classes
  data.prepare(config)
  config.dataset.name = 'digits'
  with pytest.raises(validate.ConfigError, match="source='folder' is not valid.*sklearn"):
    validate.validate_config(config)
  generic = presets.image_folder(common.base(), root=image_folder_root, image_size=16)
  generic.dataset.channels = 1
  generic.train.num_steps = 1
  generic.dataset.batch_size = 4
  validate.validate_config(generic)
  assert generic.dataset.augment == 'none'
  x = next(data.get_train_data(generic).batches(0))['inputs']
  assert x.shape[-1] == 1 and abs(float(x.mean())) < 1.0  # measured, not 0.5 / 0.5
  generic.dataset.num_classes = 1  # labels 0..1 from two folders: refused, not a NaN loss
  with pytest.raises(
    validate.ConfigError,
    match=r'num_classes=1 is not valid for .*, which '
    r'has 2 label folders; valid: >= 2, or 0',
  ):
    validate.resolved(generic)
  generic.dataset.num_classes = 0
  generic.dataset.mean = (0.5, 0.5, 0.5)
  with pytest.raises(validate.ConfigError, match=r'mean=\(0.5, 0.5, 0.5\) has 3 values'):
    validate.validate_config(generic)

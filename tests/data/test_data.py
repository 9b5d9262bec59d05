"""Input pipelines: shapes, dtypes, value ranges, determinism, resuming, sharding."""

import importlib.metadata

import numpy as np
import pytest

from configs import common
from configs import default as default_config
from configs import presets
import data
from data import arrays


def digits_config(**dataset):
  config = default_config.get_config()
  config.dataset.update(dataset)
  return config


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


# --- digits (in memory) ---------------------------------------------------------------


def test_digits_split_is_fixed_and_stratified():
  splits = arrays.load_digits()
  x_train, y_test = splits['train'].inputs, splits['test'].labels
  assert x_train.shape == (1437, 8, 8, 1) and splits['test'].inputs.shape == (360, 8, 8, 1)
  assert 0.0 <= x_train.min() and x_train.max() <= 255.0
  counts = np.bincount(y_test, minlength=10)
  assert counts.min() >= 35 and counts.max() <= 37  # 20% of each class
  np.testing.assert_array_equal(arrays.load_digits()['test'].labels, y_test)


def test_the_digits_split_is_cached_by_scikit_learn_version(tmp_path, monkeypatch, capsys):
  """The first run writes the split to the cache folder; later runs read the same arrays
  without scikit-learn; a damaged file is rebuilt and an unwritable folder only skipped."""
  monkeypatch.setenv('EFFICIENT_ATTN_CACHE', str(tmp_path / 'cache'))
  written = arrays.load_digits()
  (path,) = (tmp_path / 'cache' / 'digits').iterdir()
  assert path.name.startswith(f"digits_sklearn{importlib.metadata.version('scikit-learn')}_")
  computed = arrays._split_digits()
  with monkeypatch.context() as patch:
    patch.setattr(arrays, '_split_digits', lambda: pytest.fail('scikit-learn was asked again'))
    cached = arrays.load_digits()
  for got in (written, cached):
    for array, want in zip(
      (got['train'].inputs, got['train'].labels, got['test'].inputs, got['test'].labels),
      computed,
    ):
      assert array.dtype == want.dtype
      np.testing.assert_array_equal(array, want)
  path.write_bytes(path.read_bytes()[:-40])
  capsys.readouterr()
  np.testing.assert_array_equal(arrays.load_digits()['test'].labels, computed[3])
  assert 'damaged' in capsys.readouterr().out and path.stat().st_size > 1000
  monkeypatch.setenv('EFFICIENT_ATTN_CACHE', str(path))  # a file where the folder should be
  np.testing.assert_array_equal(arrays.load_digits()['train'].inputs, computed[0])
  assert 'the digits split is not cached' in capsys.readouterr().out


def test_digits_batches_shapes_and_ranges():
  config = digits_config(batch_size=32)
  ds = data.get_train_data(config)
  assert ds.steps_per_epoch == 1437 // 32
  batch = next(ds.batches(0))
  assert batch['inputs'].shape == (32, 8, 8, 1) and batch['inputs'].dtype == np.float32
  assert batch['label'].dtype == np.int32 and batch['mask'].dtype == np.float32
  spec = data.get_spec('digits')
  lo, hi = (0 - spec.mean[0]) / spec.std[0], (1 - spec.mean[0]) / spec.std[0]
  assert lo - 1e-5 <= batch['inputs'].min() and batch['inputs'].max() <= hi + 1e-5
  assert set(np.unique(batch['label'])) <= set(range(10))


def test_digits_order_is_a_function_of_seed_and_step():
  config = digits_config(batch_size=64)
  ds = data.get_train_data(config)
  run = take(ds.batches(0), 50)  # crosses two epoch boundaries (22 steps per epoch)
  assert_batches_equal(run, take(data.get_train_data(config).batches(0), 50))
  assert_batches_equal(run[30:], take(ds.batches(30), 20))  # resume at step 30
  other = digits_config(batch_size=64)
  other.train.seed = 1
  other_first = next(data.get_train_data(other).batches(0))
  assert not np.array_equal(run[0]['label'], other_first['label'])
  # each epoch visits distinct examples
  epoch = np.concatenate([b['inputs'].reshape(64, -1) for b in run[:22]])
  assert len(np.unique(epoch, axis=0)) == len(epoch)


def test_digits_processes_read_disjoint_slices_of_the_global_batch():
  config = digits_config(batch_size=64, eval_batch_size=100)
  whole = take(data.get_train_data(config).batches(5), 3)
  parts = [
    take(data.get_train_data(config, process_index=p, process_count=2).batches(5), 3)
    for p in range(2)
  ]
  for i in range(3):
    for k in whole[i]:
      np.testing.assert_array_equal(whole[i][k], np.concatenate([parts[0][i][k], parts[1][i][k]]))
  # evaluation: every test example exactly once over the processes
  evals = [data.get_eval_data(config, process_index=p, process_count=2) for p in range(2)]
  assert evals[0].num_batches == evals[1].num_batches
  labels = np.concatenate([b['label'][b['mask'] > 0] for e in evals for b in e.batches()])
  np.testing.assert_array_equal(np.sort(labels), np.sort(arrays.load_digits()['test'].labels))


def test_eval_batches_are_padded_with_zero_mask():
  config = digits_config(eval_batch_size=100)
  ds = data.get_eval_data(config)
  batches = list(ds.batches())
  assert ds.num_batches == 4 and all(b['inputs'].shape == (100, 8, 8, 1) for b in batches)
  assert [b['mask'].sum() for b in batches] == [100, 100, 100, 60]
  batch = data.get_eval_batch(config)
  assert batch['inputs'].shape == (100, 8, 8, 1)


def test_any_eval_batch_size_fits_any_processes_and_mesh_rows():
  """250 over 3 processes whose rows are split over 4 devices each: 84 rows a batch per
  process (250 / 3 rounded up, then to a multiple of 4), every test example exactly once
  over the processes, the rest padding of mask 0."""
  from data import specs  # pylint: disable=g-import-not-at-top

  assert specs.eval_local_batch(250, 1, 4) == 252
  assert specs.eval_local_batch(250, 3, 4) == 84
  assert specs.eval_local_batch(8, 2, 1) == 4
  with pytest.raises(ValueError, match=r'eval_batch_size=0 is not valid; valid: integers >= 1'):
    specs.eval_local_batch(0, 1, 4)
  config = digits_config(eval_batch_size=250)
  evals = [
    data.get_eval_data(config, process_index=p, process_count=3, row_multiple=4) for p in range(3)
  ]
  batches = [b for e in evals for b in e.batches()]
  assert all(b['inputs'].shape[0] == 84 for b in batches)
  assert len({e.num_batches for e in evals}) == 1
  labels = np.concatenate([b['label'][b['mask'] > 0] for b in batches])
  np.testing.assert_array_equal(np.sort(labels), np.sort(arrays.load_digits()['test'].labels))
  padding = np.concatenate([b['inputs'][b['mask'] == 0] for b in batches])
  assert len(padding) == 3 * evals[0].num_batches * 84 - 360 and not padding.any()


# --- TFDS datasets on mock data ----------------------------------------------------------


def tfds_config(name):
  config = common.base()
  preset = {
    'mnist': presets.mnist,
    'cifar10': presets.cifar10,
    'cifar100': presets.cifar100,
    'imagenet2012': presets.imagenet,
    'imdb_reviews': presets.imdb,
  }[name]
  preset(config)
  if name == 'imagenet2012':
    config.dataset.image_size = 112
  config.dataset.update(dict(batch_size=4, eval_batch_size=3, shuffle_buffer=16))
  return config


@pytest.mark.parametrize('name', ['mnist', 'cifar10', 'cifar100', 'imagenet2012', 'imdb_reviews'])
def test_tfds_pipeline_on_mock_data(name):
  tfds = pytest.importorskip('tensorflow_datasets')
  config = tfds_config(name)
  spec = data.get_spec(name)
  with tfds.testing.mock_data(num_examples=10):
    ds = data.get_train_data(config)
    assert ds.num_examples == 10 and ds.steps_per_epoch == 2
    run = take(ds.batches(0), 5)
    resumed = take(ds.batches(3), 2)
    eval_data = data.get_eval_data(config)
    eval_batches = list(eval_data.batches())
  assert_batches_equal(run[3:], resumed)
  batch = run[0]
  d = config.dataset
  if spec.kind == 'image':
    assert batch['inputs'].shape == (4, d.image_size, d.image_size, d.channels)
    assert batch['inputs'].dtype == np.float32
    mean, std = np.asarray(spec.mean), np.asarray(spec.std)
    lo, hi = ((0 - mean) / std).min(), ((1 - mean) / std).max()
    assert lo - 1e-4 <= batch['inputs'].min() and batch['inputs'].max() <= hi + 1e-4
    assert batch['inputs'].std() > 0.1  # not blank
  else:
    assert batch['inputs'].shape == (4, d.max_length) and batch['inputs'].dtype == np.int32
    assert 0 <= batch['inputs'].min() and batch['inputs'].max() <= 256
    assert (batch['inputs'][:, 0] > 0).all()  # starts with text, padding (0) at the end
  assert batch['label'].dtype == np.int32
  assert 0 <= batch['label'].min() and batch['label'].max() < spec.num_classes
  np.testing.assert_array_equal(batch['mask'], np.ones(4, np.float32))
  assert eval_data.num_batches == 4
  assert [float(b['mask'].sum()) for b in eval_batches] == [3, 3, 3, 1]
  assert all(b['inputs'].shape[0] == 3 for b in eval_batches)


def test_streamed_eval_batches_round_up_to_the_row_multiple():
  tfds = pytest.importorskip('tensorflow_datasets')
  config = tfds_config('mnist')  # eval_batch_size 3
  with tfds.testing.mock_data(num_examples=10):
    batches = list(data.get_eval_data(config, row_multiple=2).batches())
  assert [b['inputs'].shape[0] for b in batches] == [4, 4, 4]
  assert [float(b['mask'].sum()) for b in batches] == [4, 4, 2]
  assert not batches[-1]['inputs'][2:].any()


def test_tfds_training_order_depends_on_the_seed():
  tfds = pytest.importorskip('tensorflow_datasets')
  config = tfds_config('cifar10')
  with tfds.testing.mock_data(num_examples=16):
    a = take(data.get_train_data(config).batches(0), 4)
    b = take(data.get_train_data(config).batches(0), 4)
    config.train.seed = 7
    c = take(data.get_train_data(config).batches(0), 4)
  assert_batches_equal(a, b)
  assert not all(np.array_equal(x['inputs'], y['inputs']) for x, y in zip(a, c))


def test_byte_tokens():
  tf = pytest.importorskip('tensorflow')
  from data import preprocess  # pylint: disable=g-import-not-at-top

  ids = preprocess.byte_tokens(tf.constant('hé!'), 6).numpy()
  np.testing.assert_array_equal(ids, [ord('h') + 1, 0xC3 + 1, 0xA9 + 1, ord('!') + 1, 0, 0])
  assert preprocess.byte_tokens(tf.constant('abcdef'), 3).numpy().tolist() == [98, 99, 100]


# --- ImageFolder -------------------------------------------------------------------------


def test_image_folder(image_folder_root):
  config = presets.image_folder(common.base(), root=image_folder_root, image_size=16)
  config.dataset.update(dict(batch_size=4, eval_batch_size=4, channels=3))
  data.prepare(config)
  assert data.num_classes(config) == 2
  ds = data.get_train_data(config)
  assert ds.num_examples == 12 and ds.steps_per_epoch == 3
  run = take(ds.batches(0), 4)
  assert_batches_equal(run[2:], take(ds.batches(2), 2))
  assert run[0]['inputs'].shape == (4, 16, 16, 3) and run[0]['inputs'].dtype == np.float32
  assert set(np.concatenate([b['label'] for b in run[:3]])) == {0, 1}
  evals = [data.get_eval_data(config, process_index=p, process_count=2) for p in range(2)]
  masks = [b['mask'].sum() for e in evals for b in e.batches()]
  assert sum(masks) == 6
  parts = [
    next(data.get_train_data(config, process_index=p, process_count=2).batches(0)) for p in range(2)
  ]
  assert all(p['inputs'].shape == (2, 16, 16, 3) for p in parts)


def test_prepare_names_the_missing_field(tmp_path):
  config = presets.image_folder(common.base(), root=str(tmp_path / 'nope'))
  with pytest.raises(ValueError, match=r'config\.dataset\.data_dir=.*nope'):
    data.prepare(config)
  config = presets.cifar10(common.base())
  config.dataset.update(dict(data_dir=str(tmp_path), download=False))
  with pytest.raises(ValueError, match=r"'cifar10' is not prepared.*config\.dataset\.download"):
    data.prepare(config)
  config = presets.imagenet(common.base())
  config.dataset.data_dir = str(tmp_path)
  with pytest.raises(ValueError, match=r'config\.dataset\.manual_dir'):
    data.prepare(config)

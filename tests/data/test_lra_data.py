"""Offline Long Range Arena data: ListOps generator, Pathfinder generator and reader, AAN reader."""

import json
import os
import re

import helpers
import numpy as np
import pytest
from scipy import ndimage

from data import aan
from data import listops
from data import listops_files
from data import npz_cache
from data import pathfinder
from data import pathfinder_contours

# ----------------------------------------------------------------------------- ListOps


@pytest.mark.parametrize(
  'expression, value',
  [
    ('[MAX 2 9 ]', 9),
    ('[MIN 4 7 1 ]', 1),
    ('[MED 1 5 8 9 2 ]', 5),  # odd count: the middle of 1 2 5 8 9
    ('[MED 1 2 ]', 1),  # even count: (1 + 2) / 2 = 1.5, rounded down
    ('[MED 3 8 0 9 ]', 5),  # 0 3 8 9: (3 + 8) / 2 = 5.5 -> 5
    ('[SM 7 8 9 ]', 4),  # 24 mod 10
    ('[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]', 5),  # the example of Tay et al. (2021)
    ('[SM [MAX 9 9 ] [MIN 9 8 ] [MED 7 9 ] 1 ]', 6),  # 9 + 8 + 8 + 1 = 26
    ('[MIN [SM 5 5 ] [MAX 3 [MED 6 2 4 ] ] ]', 0),  # SM = 0, MED = 4, MAX = 4
    ('[MED [SM 9 9 ] [MAX 0 1 ] 7 [MIN 6 4 ] ]', 5),  # 8 1 7 4 -> 1 4 7 8 -> 5
    ('( ( ( [MAX 2 ) 9 ) X )', 9),  # LRA's TSV form: parentheses, and X for ]
    ('7', 7),
  ],
)
def test_listops_evaluate_hand_computed(expression, value):
  assert listops.evaluate(expression) == value
  ids = listops.encode(expression)
  assert listops.evaluate(ids) == value
  assert listops.evaluate(np.pad(ids, (0, 5))) == value  # trailing padding is ignored
  assert listops.evaluate(listops.decode(ids).split()) == value


def test_listops_evaluate_tree_and_median_rule():
  tree = (listops.MED, [1, (listops.SUM_MOD, [9, 9]), 7, 4])  # 1 8 7 4 -> 1 4 7 8 -> 5
  assert listops.evaluate(tree) == 5
  rng = np.random.default_rng(0)
  for n in range(1, 12):  # LRA's rule is int(np.median(args))
    args = rng.integers(0, 10, n).tolist()
    assert listops.apply_operator(listops.MED, args) == int(np.median(args))


@pytest.mark.parametrize('bad', ['[MAX 2 9', '] 3', '3 4', '[MAX 2 [MIN 1 ] ] ]', '[FOO 1 ]', ''])
def test_listops_evaluate_rejects_malformed(bad):
  with pytest.raises(ValueError):
    listops.evaluate(bad)


@pytest.fixture(scope='module')
def listops_lra_sample():
  """400 expressions with LRA's settings (lengths in (500, 2000))."""
  return listops.generate(400, seed=0)


def test_listops_generate_deterministic_and_seeded():
  a = listops.generate(30, seed=3, min_length=10, max_length=60)
  b = listops.generate(30, seed=3, min_length=10, max_length=60)
  c = listops.generate(30, seed=4, min_length=10, max_length=60)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a.tokens, c.tokens)


def test_listops_lengths_and_labels_lra_like(listops_lra_sample):
  tokens, labels, lengths = listops_lra_sample
  assert tokens.dtype == np.int16 and tokens.shape == (400, 2000)
  assert labels.dtype == np.int64 and lengths.dtype == np.int64
  # LRA keeps 500 < length < 2000; a restatement of LRA's recursive generator gave a
  # mean of ~1048 and a median of ~968 tokens on 3,000 draws.
  assert lengths.min() > 500 and lengths.max() < 2000
  assert 900 < lengths.mean() < 1200, lengths.mean()
  np.testing.assert_array_equal((tokens != 0).sum(1), lengths)
  assert all(not tokens[i, lengths[i] :].any() for i in range(len(tokens)))  # left-aligned
  for i in range(0, 400, 40):
    assert listops.evaluate(tokens[i]) == labels[i]
  # ListOps is imbalanced: MIN and MAX near the root make 0 and 9 about twice as common
  # (~17% each on 5,000 draws; the others 7.5-9.5%). All classes appear and none exceeds
  # 2.5x (or falls below 0.4x) the uniform rate.
  counts = np.bincount(labels, minlength=10)
  assert counts.min() >= 0.4 * 40 and counts.max() <= 2.5 * 40, counts
  assert counts[0] > 1.3 * 40 and counts[9] > 1.3 * 40, counts


def test_listops_unique_and_exclude():
  """Tiny expressions (3-5 tokens) collide often: draws stay unique and avoid `exclude`."""
  a = listops.generate(60, seed=0, min_length=2, max_length=6)
  keys_a = {listops.fingerprint(row) for row in a.tokens}
  assert len(keys_a) == 60
  b = listops.generate(60, seed=1, min_length=2, max_length=6, exclude=keys_a)
  assert not keys_a & {listops.fingerprint(row) for row in b.tokens}


def test_listops_bad_arguments():
  with pytest.raises(ValueError, match='min_length'):
    listops.generate(1, seed=0, min_length=100, max_length=101)
  with pytest.raises(ValueError, match='max_args'):
    listops.generate(1, seed=0, max_args=1)
  with pytest.raises(ValueError, match='unreachable'):
    listops.generate(1, seed=0, max_depth=2, max_args=3, min_length=10, max_length=60)
  with pytest.raises(ValueError, match='valid'):
    listops_files.write_splits('/nonexistent', max_lenght=3)


def test_listops_write_splits_round_trip(tmp_path, capsys):
  sizes = {'train': 12, 'validation': 4, 'test': 4}
  paths = listops_files.write_splits(
    str(tmp_path), seed=0, sizes=sizes, max_length=60, min_length=10
  )
  key = re.fullmatch(r'listops_10-60_([0-9a-f]{12})_train\.npz', os.path.basename(paths[0]))[1]
  # Not LRA's lengths, and the key of every split's settings (seed and sizes included).
  assert paths == [str(tmp_path / f'listops_10-60_{key}_{s}.npz') for s in sizes]
  rows = {}
  for split, path in zip(sizes, paths):
    with np.load(path) as data:
      assert set(data.files) == {'tokens', 'y', 'lengths', 'settings_json'}
      tokens, y, lengths = data['tokens'], data['y'], data['lengths']
      settings = json.loads(data['settings_json'].tobytes())
    assert tokens.shape == (sizes[split], 60) and tokens.dtype == np.int16
    assert y.dtype == np.int64 and ((0 <= y) & (y <= 9)).all()
    assert ((10 < lengths) & (lengths < 60)).all()
    assert [listops.evaluate(t) for t in tokens] == y.tolist()
    assert settings['split'] == split and settings['max_length'] == 60
    rows[split] = {t.tobytes() for t in tokens}
  assert not rows['train'] & rows['validation'] and not rows['train'] & rows['test']
  assert not rows['validation'] & rows['test']

  mtimes = [os.stat(p).st_mtime_ns for p in paths]
  capsys.readouterr()
  listops_files.write_splits(str(tmp_path), seed=0, sizes=sizes, max_length=60, min_length=10)
  assert [os.stat(p).st_mtime_ns for p in paths] == mtimes  # idempotent: nothing rewritten
  assert capsys.readouterr().out == ''  # up to date: silent (every open of the data checks)

  os.remove(paths[2])  # resumes with the missing split only, identical to before
  listops_files.write_splits(str(tmp_path), seed=0, sizes=sizes, max_length=60, min_length=10)
  assert [os.stat(p).st_mtime_ns for p in paths[:2]] == mtimes[:2]
  with np.load(paths[2]) as data:
    assert {t.tobytes() for t in data['tokens']} == rows['test']

  mtimes = [os.stat(p).st_mtime_ns for p in paths]
  other = listops_files.write_splits(
    str(tmp_path), seed=1, sizes=sizes, max_length=60, min_length=10
  )
  assert not set(other) & set(paths)  # other settings: files of their own (issue 70, item 1)
  with np.load(other[0]) as data:
    assert {t.tobytes() for t in data['tokens']} != rows['train']
  assert [os.stat(p).st_mtime_ns for p in paths] == mtimes  # seed 0's files kept


# ----------------------------------------------------------------------------- Pathfinder


@pytest.fixture(scope='module')
def pathfinder_sample():
  return pathfinder_contours.generate(64, seed=0, contour_length=14, with_discs=True)


def test_pathfinder_shapes_balance_and_values(pathfinder_sample):
  images, labels, discs = pathfinder_sample
  assert images.shape == (64, 32, 32) and images.dtype == np.uint8
  assert labels.shape == (64,) and labels.dtype == np.int64
  assert set(np.unique(images)) == {0, 255}
  assert labels.sum() == 32 and set(np.unique(labels)) == {0, 1}  # exactly balanced
  assert discs.shape == (64, 2, 2) and ((1 <= discs) & (discs <= 30)).all()
  for image, disc in zip(images, discs):
    for y, x in disc:
      assert (image[y - 1 : y + 2, x - 1 : x + 2] == 255).all()  # 3x3 discs
  # Dashed paths: with 1-pixel gaps every dash is its own 8-connected piece.
  pieces = [ndimage.label(image > 0, structure=np.ones((3, 3)))[1] for image in images]
  assert np.mean(pieces) > 20


def test_pathfinder_deterministic_and_seeded(pathfinder_sample):
  images, labels, discs = pathfinder_contours.generate(
    64, seed=0, contour_length=14, with_discs=True
  )
  np.testing.assert_array_equal(images, pathfinder_sample[0])
  np.testing.assert_array_equal(labels, pathfinder_sample[1])
  np.testing.assert_array_equal(discs, pathfinder_sample[2])
  other, _ = pathfinder_contours.generate(64, seed=1, contour_length=14)
  assert not np.array_equal(other, images)


@pytest.mark.parametrize('contour_length, num_distractors', [(6, 0), (14, 0), (9, None)])
def test_pathfinder_label_is_connectivity(contour_length, num_distractors):
  """With solid curves (gap=0) the discs share an 8-connected component iff the label is 1.

  Paths keep a one-pixel empty margin from each other, so this holds with distractors too.
  Random labels would disagree with the flood fill on about half of the images.
  """
  images, labels, discs = pathfinder_contours.generate(
    60,
    seed=contour_length,
    contour_length=contour_length,
    gap=0,
    num_distractors=num_distractors,
    with_discs=True,
  )
  connected = []
  for image, (a, b) in zip(images, discs):
    components, _ = ndimage.label(image > 0, structure=np.ones((3, 3)))
    connected.append(components[tuple(a)] == components[tuple(b)])
  assert 0 < labels.sum() < len(labels)
  np.testing.assert_array_equal(np.asarray(connected, np.int64), labels)


def test_pathfinder_bad_arguments():
  with pytest.raises(ValueError, match='contour_length'):
    pathfinder_contours.generate(2, seed=0, contour_length=1)
  with pytest.raises(ValueError, match='continuity'):
    pathfinder_contours.generate(2, seed=0, continuity=0.5)
  with pytest.raises(ValueError, match='contour_length must be one of'):
    pathfinder.read_released('/nonexistent', contour_length=7)


def test_pathfinder_write_splits_round_trip(tmp_path, capsys):
  sizes = {'train': 8, 'validation': 4, 'test': 4}
  paths = pathfinder.write_splits(str(tmp_path), seed=0, sizes=sizes, contour_length=6)
  key = npz_cache.settings_key(pathfinder.split_settings(0, sizes, contour_length=6))
  assert paths == [str(tmp_path / f'pathfinder6_{key}_{s}.npz') for s in sizes]
  images = {}
  for split, path in zip(sizes, paths):
    with np.load(path) as data:
      assert set(data.files) == {'x', 'y', 'settings_json'}
      assert data['x'].shape == (sizes[split], 32, 32) and data['x'].dtype == np.uint8
      assert data['y'].dtype == np.int64 and data['y'].sum() == sizes[split] // 2
      assert json.loads(data['settings_json'].tobytes())['contour_length'] == 6
      images[split] = data['x']
  assert not np.array_equal(images['validation'], images['test'])
  mtimes = [os.stat(p).st_mtime_ns for p in paths]
  capsys.readouterr()
  pathfinder.write_splits(str(tmp_path), seed=0, sizes=sizes, contour_length=6)
  assert [os.stat(p).st_mtime_ns for p in paths] == mtimes
  assert capsys.readouterr().out == ''  # up to date: silent (every open of the data checks)


def _write_released(root, folder, batches):
  """A tiny copy of the released layout: imgs/<batch>/sample_<i>.png, metadata/<batch>.npy."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  base = os.path.join(root, folder)
  os.makedirs(os.path.join(base, 'metadata'))
  expected_images, expected_labels = [], []
  rng = np.random.default_rng(0)
  for batch, (count, empty) in enumerate(batches):
    os.makedirs(os.path.join(base, 'imgs', str(batch)))
    lines = []
    for i in range(count):
      label = int(rng.integers(0, 2))
      path = os.path.join(base, 'imgs', str(batch), f'sample_{i}.png')
      if i == empty:
        open(path, 'wb').close()  # LRA drops images whose file is empty
      else:
        image = rng.integers(0, 256, (32, 32), dtype=np.uint8)
        Image.fromarray(image).save(path)
        expected_images.append(image)
        expected_labels.append(label)
      lines.append(f'imgs/{batch} sample_{i}.png {i} {label} 1.0 14 4 2 0.5 1 1')
    with open(os.path.join(base, 'metadata', f'{batch}.npy'), 'w') as f:
      f.write('\n'.join(lines) + '\n')
  return np.stack(expected_images), np.asarray(expected_labels)


def test_pathfinder_read_released(tmp_path):
  # Batches 0, 1 and 10: metadata files must be read in numeric order (10 after 1).
  expected, labels = _write_released(
    str(tmp_path), 'curv_contour_length_14', [(3, None), (4, 2), (2, None)]
  )
  os.rename(
    tmp_path / 'curv_contour_length_14' / 'metadata' / '2.npy',
    tmp_path / 'curv_contour_length_14' / 'metadata' / '10.npy',
  )
  images, got = pathfinder.read_released(str(tmp_path), contour_length=14)
  assert images.dtype == np.uint8 and images.shape == (8, 32, 32)
  assert got.dtype == np.int64
  np.testing.assert_array_equal(images, expected)
  np.testing.assert_array_equal(got, labels)

  expected6, labels6 = _write_released(str(tmp_path), 'curv_baseline', [(2, None)])
  images6, got6 = pathfinder.read_released(str(tmp_path), contour_length=6)
  np.testing.assert_array_equal(images6, expected6)
  np.testing.assert_array_equal(got6, labels6)


def test_pathfinder_read_released_binary_metadata(tmp_path):
  """Also reads metadata saved with np.save (what the Linsley et al. generator calls)."""
  expected, labels = _write_released(str(tmp_path), 'curv_contour_length_9', [(3, None)])
  meta = tmp_path / 'curv_contour_length_9' / 'metadata' / '0.npy'
  rows = [line.split() for line in meta.read_text().splitlines()]
  with open(meta, 'wb') as f:
    np.save(f, np.array(rows))
  images, got = pathfinder.read_released(str(tmp_path), contour_length=9)
  np.testing.assert_array_equal(images, expected)
  np.testing.assert_array_equal(got, labels)


# ----------------------------------------------------------------------------- AAN

_TSV_ROWS = [
  (b'1.0', b'P05-1001', b'W04-2401', b"b'Quotes \"stay\", commas too'", b"b'line\\nbreak'"),
  (b'0', b'D07-1104', b'J93-2004', 'caf\u00e9 \u2013 utf-8'.encode(), b'plain text'),
  (b'1', b'A00-1001', b'A00-1002', b'x', b''),
]


def _write_tsv(path, rows):
  with open(path, 'wb') as f:
    f.write(b''.join(b'\t'.join(row) + b'\n' for row in rows))


def test_aan_read_tsv(tmp_path):
  path = str(tmp_path / 'new_aan_pairs.eval.tsv')
  _write_tsv(path, _TSV_ROWS)
  text1, text2, labels = aan.read_tsv(path)
  assert text1 == [row[3] for row in _TSV_ROWS] and text2 == [row[4] for row in _TSV_ROWS]
  assert labels.dtype == np.int64 and labels.tolist() == [1, 0, 1]

  _write_tsv(path, _TSV_ROWS[:1])
  text1, text2, _ = aan.read_tsv(path, unescape=True)
  assert text1 == [b'Quotes "stay", commas too'] and text2 == [b'line\nbreak']
  _write_tsv(path, _TSV_ROWS[1:2])
  with pytest.raises(ValueError, match='bytes literals'):
    aan.read_tsv(path, unescape=True)


@pytest.mark.parametrize(
  'row, match',
  [
    ((b'1', b'a', b'b', b'only four'), '5 tab-separated'),
    ((b'label', b'id1', b'id2', b'text1', b'text2'), 'label must be 0 or 1'),
    ((b'2', b'a', b'b', b'c', b'd'), 'label must be 0 or 1'),
  ],
)
def test_aan_read_tsv_rejects_bad_rows(tmp_path, row, match):
  path = str(tmp_path / 'bad.tsv')
  _write_tsv(path, [_TSV_ROWS[2], row])
  with pytest.raises(ValueError, match=match) as error:
    aan.read_tsv(path)
  assert 'bad.tsv:2' in str(error.value)


def test_aan_tsv_to_npz(tmp_path):
  path, out = str(tmp_path / 'pairs.tsv'), str(tmp_path / 'pairs.npz')
  _write_tsv(path, _TSV_ROWS)
  assert aan.tsv_to_npz(path, out) == out
  text1, text2, labels = aan.read_tsv(path)
  with np.load(out) as data:
    assert set(data.files) == {'text_utf8', 'offsets', 'text2_utf8', 'offsets2', 'y'}
    assert data['offsets'].dtype == np.int64 and data['offsets'].shape == (4,)
    for texts, blob, offsets in (
      (text1, data['text_utf8'], data['offsets']),
      (text2, data['text2_utf8'], data['offsets2']),
    ):
      assert blob.dtype == np.uint8
      assert [blob[offsets[i] : offsets[i + 1]].tobytes() for i in range(3)] == texts
    np.testing.assert_array_equal(data['y'], labels)


# ----------------------------------------------------------------------------- as datasets


@pytest.mark.parametrize('path', ['configs/lra/listops.py', 'configs/lra/pathfinder.py'])
def test_generated_source_writes_once_and_batches_like_arrays(path, tmp_path, capsys):
  """In a bucket: TF's in-memory ram:// file system stands for gs:// (the cache
  used plain open() and os calls, so a gs:// data_dir failed)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import data  # pylint: disable=g-import-not-at-top
  from data import arrays  # pylint: disable=g-import-not-at-top
  from data import generated  # pylint: disable=g-import-not-at-top
  from data import npz_cache  # pylint: disable=g-import-not-at-top

  folder = f'ram://{tmp_path.name}/lra'
  config = helpers.load_config(path, 'size=small')
  config.dataset.update(dict(data_dir=folder, batch_size=4, eval_batch_size=3))
  config.dataset.sizes.update(dict(train=8, validation=3, test=3))
  batch = next(data.get_train_data(config).batches(0))
  files = sorted(tf.io.gfile.listdir(folder))
  assert len(files) == 3 and all(f.endswith('.npz') for f in files), files
  pattern = generated.pattern(config)
  stored = arrays.read_npz(pattern.format(split='train'))
  d = config.dataset
  n = d.max_length if d.name == 'listops' else d.image_size**2  # small: 256 either way
  prefix = 'pathfinder6_16px_' if d.name == 'pathfinder' else 'listops_64-256_'
  assert all(f.startswith(prefix) for f in files), files  # not LRA's sizes: files of their own
  assert batch['inputs'].shape == (4, n) and batch['label'].shape == (4,)
  assert set(np.unique(batch['label'])) <= set(range(config.dataset.num_classes))
  assert len(stored) == 8
  ev = data.get_eval_batch(config)
  assert ev['inputs'].shape[0] == 3
  contents = {f: npz_cache.read_bytes(f'{folder}/{f}') for f in files}
  arrays.clear_cache()
  capsys.readouterr()
  generated.ensure(config)  # up to date: nothing is drawn again
  assert capsys.readouterr().out == ''  # up to date: silent (every open of the data checks)
  assert contents == {f: npz_cache.read_bytes(f'{folder}/{f}') for f in tf.io.gfile.listdir(folder)}
  config.dataset.data_dir = ''
  with pytest.raises(ValueError, match="data_dir='' is not valid for the generated"):
    generated.ensure(config)


def test_released_pathfinder_and_aan_files_in_a_bucket(tmp_path):
  """read_released and tsv_to_npz on ram:// (standing for gs://) as on a local disk."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from data import arrays  # pylint: disable=g-import-not-at-top

  expected, labels = _write_released(str(tmp_path / 'local'), 'curv_baseline', [(3, 1)])
  bucket = f'ram://{tmp_path.name}'
  for base, _, names in os.walk(tmp_path / 'local'):
    target = bucket + base[len(str(tmp_path / 'local')) :]
    tf.io.gfile.makedirs(target)
    for name in names:
      tf.io.gfile.copy(os.path.join(base, name), f'{target}/{name}', overwrite=True)
  images, got = pathfinder.read_released(bucket, contour_length=6)
  np.testing.assert_array_equal(images, expected)
  np.testing.assert_array_equal(got, labels)

  tsv = str(tmp_path / 'pairs.tsv')
  _write_tsv(tsv, _TSV_ROWS)
  out = aan.tsv_to_npz(tsv, f'{bucket}/pairs.npz')
  assert sorted(n.rstrip('/') for n in tf.io.gfile.listdir(bucket)) == [
    'curv_baseline',
    'pairs.npz',
  ]  # no temporary file left
  read = arrays.read_npz(out)
  assert read.inputs == aan.read_tsv(tsv)[0] and read.labels.tolist() == [1, 0, 1]


def test_pixel_tokens_are_all_attended_without_padding():
  """Pathfinder / Image: pixel value 0 is black, not padding (TextClassifier padding=False)."""
  import jax  # pylint: disable=g-import-not-at-top

  from efficient_attn import models  # pylint: disable=g-import-not-at-top

  cfg = models.TransformerConfig(d_model=16, depth=1, num_heads=2, mlp_dim=16, max_length=8)
  tokens = np.array([[5, 7, 3, 9, 0, 0, 0, 0]])  # text pads at the end
  for padding, moves in ((False, True), (True, False)):
    model = models.TextClassifier(cfg, num_classes=3, vocab_size=256, pool='mean', padding=padding)
    rng = np.random.default_rng(0)  # every weight random (the head starts at zero)
    params = jax.tree.map(
      lambda p: p + 0.1 * rng.normal(size=p.shape).astype(p.dtype),
      model.init(jax.random.key(0), tokens),
    )
    moved = jax.tree_util.tree_map_with_path(  # another embedding for id 0 only
      lambda path, p: (
        p.at[0].add(rng.normal(size=p.shape[1:]).astype(p.dtype))
        if jax.tree_util.keystr(path).endswith("['embed']['embedding']")
        else p
      ),
      params,
    )
    a, b = model.apply(params, tokens), model.apply(moved, tokens)
    assert bool(np.any(np.abs(np.asarray(a) - np.asarray(b)) > 1e-6)) == moves, padding


# ----------------------------------------------------------------------------- Retrieval


def _retrieval_config(folder, mechanism='softmax', max_length=24):
  config = helpers.load_config(
    'configs/lra/retrieval.py', f'{mechanism},size=small,data_dir={folder}'
  )
  config.dataset.update(dict(max_length=max_length, batch_size=2, eval_batch_size=3))
  return config


def test_retrieval_source_batches_byte_pairs(tmp_path):
  """The 'tsv' source: LRA's three files as train / validation / test, each example the
  byte ids of its two documents `[2, max_length]`, in the files' order for evaluation."""
  from conftest import write_aan_folder  # pylint: disable=g-import-not-at-top

  import data  # pylint: disable=g-import-not-at-top

  folder = write_aan_folder(str(tmp_path / 'tsv'))
  config = _retrieval_config(folder)
  text1, text2, labels = aan.read_tsv(os.path.join(folder, 'new_aan_pairs.eval.tsv'))
  batches = list(data.get_eval_data(config).batches())
  inputs = np.concatenate([b['inputs'] for b in batches])[: len(labels)]
  assert inputs.shape == (4, 2, 24) and inputs.dtype == np.int32
  for i in range(4):
    for k, text in enumerate((text1[i], text2[i])):
      ids = np.frombuffer(text[:24], np.uint8).astype(np.int32) + 1
      np.testing.assert_array_equal(inputs[i, k], np.pad(ids, (0, 24 - len(ids))))
  np.testing.assert_array_equal(np.concatenate([b['label'] for b in batches])[:4], labels)
  assert data.num_examples(config, 'train') == 6
  assert next(data.get_train_data(config).batches(0))['inputs'].shape == (2, 2, 24)
  config.dataset.data_dir = str(tmp_path / 'missing')
  with pytest.raises(ValueError, match='missing.*no such folder'):
    data.num_examples(config, 'train')


def test_text_matcher_is_a_shared_dual_encoder():
  """TextMatcher = one encoder on both documents, [e1, e2] (or NLI features), an MLP; padding
  of either document changes nothing; swapping the documents moves the logits."""
  import jax  # pylint: disable=g-import-not-at-top

  from efficient_attn import models  # pylint: disable=g-import-not-at-top
  from efficient_attn.models import text  # pylint: disable=g-import-not-at-top

  cfg = models.TransformerConfig(d_model=16, depth=1, num_heads=2, mlp_dim=12, max_length=10)
  rng = np.random.default_rng(0)
  tokens = np.zeros((3, 2, 10), np.int32)
  for i in range(3):
    for k in range(2):
      n = rng.integers(2, 9)
      tokens[i, k, :n] = rng.integers(1, 257, n)
  for interaction in ('concat', 'nli'):
    model = models.TextMatcher(cfg, num_classes=2, vocab_size=257, interaction=interaction)
    params = jax.jit(model.init)(jax.random.key(0), tokens)['params']
    assert set(params) == {'tower', 'mlp', 'mlp2', 'head'}  # one encoder for both documents
    assert params['mlp2']['kernel'].shape == (12, 6)
    apply = jax.jit(lambda t: model.apply({'params': params}, t))  # one program per shape
    logits = np.asarray(apply(tokens), np.float64)
    tower = text._Tower(cfg, 257, 'mean')  # pylint: disable=protected-access
    encode = jax.jit(lambda t: tower.apply({'params': params['tower']}, t, train=False))
    e1, e2 = (np.asarray(encode(tokens[:, k]), np.float64) for k in range(2))
    x = np.concatenate([e1, e2] + ([e1 * e2, e1 - e2] if interaction == 'nli' else []), -1)
    for name in ('mlp', 'mlp2', 'head'):
      p = jax.tree.map(lambda a: np.asarray(a, np.float64), params[name])
      x = x @ p['kernel'] + p['bias']
      x = np.maximum(x, 0) if name != 'head' else x
    np.testing.assert_allclose(logits, x, rtol=1e-4, atol=1e-5)
    short = tokens[:, :, :9]  # one padding column fewer: the same pairs
    np.testing.assert_allclose(apply(short), logits, atol=1e-5)
    swapped = np.asarray(apply(tokens[:, ::-1]))
    assert not np.allclose(swapped, logits, atol=1e-4), interaction  # [e1, e2] is ordered
  with pytest.raises(ValueError, match=r'pairs \[batch, 2, length\]'):
    model.apply({'params': params}, tokens[:, 0])
  with pytest.raises(ValueError, match="interaction='dot' is not valid; valid choices: concat"):
    models.TextMatcher(cfg, num_classes=2, vocab_size=257, interaction='dot').init(
      jax.random.key(0), tokens
    )


def test_sinusoidal_positions_are_fixed():
  """positions='sinusoidal' (LRA's default): sin / cos of p / 10000^(2i/d), no parameter."""
  import jax  # pylint: disable=g-import-not-at-top

  from efficient_attn import models  # pylint: disable=g-import-not-at-top
  from efficient_attn.models import text  # pylint: disable=g-import-not-at-top

  table = text.sinusoidal_positions(50, 6)
  assert table.shape == (1, 50, 6)
  p, i = 37, 2  # features 2i (sin) and 2i + 1 (cos)
  angle = p / 10000.0 ** (2 * i / 6)
  np.testing.assert_allclose(table[0, p, 2 * i], np.sin(angle), rtol=1e-6)
  np.testing.assert_allclose(table[0, p, 2 * i + 1], np.cos(angle), rtol=1e-6)
  assert text.sinusoidal_positions(4, 5).shape == (1, 4, 5)  # odd width
  cfg = models.TransformerConfig(d_model=8, depth=1, num_heads=2, mlp_dim=8, max_length=6)
  tokens = np.array([[3, 4, 5, 0, 0, 0]])
  fixed = models.TextClassifier(cfg, num_classes=2, vocab_size=9, positions='sinusoidal')
  learned = models.TextClassifier(cfg, num_classes=2, vocab_size=9)
  assert 'pos_embedding' not in fixed.init(jax.random.key(0), tokens)['params']
  assert 'pos_embedding' in learned.init(jax.random.key(0), tokens)['params']
  # The same tokens in another order give other features (mean pooling alone would not).
  tower = text._Tower(cfg, 9, 'mean', 'sinusoidal')  # pylint: disable=protected-access
  params = tower.init(jax.random.key(0), tokens, train=False)
  a = tower.apply(params, tokens, train=False)
  assert not np.allclose(a, tower.apply(params, np.array([[5, 4, 3, 0, 0, 0]]), train=False))
  with pytest.raises(ValueError, match="positions='rope' is not valid; valid choices: learned"):
    models.TextClassifier(cfg, num_classes=2, vocab_size=9, positions='rope').init(
      jax.random.key(0), tokens
    )

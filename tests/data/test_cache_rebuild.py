"""A damaged or short cache file of a generated dataset (MQAR, ListOps, Pathfinder, byte-LM
windows) is rebuilt, with one line saying so (issue 59, item 8).

A file whose bytes changed after it was written kept its settings, so it was kept, and
every run then stopped on it ("... is not a readable .npz file"); one holding fewer
rows than its settings say was used as it was. Both are now written again, as a
truncated file (unreadable settings) always was, and say so in one line.
"""

import json
import os
import zipfile

import numpy as np
import pytest

from configs import mqar as mqar_config
from data import arrays
from data import cache_folder
from data import listops_files
from data import mqar
from data import npz_cache
from data import pathfinder
from data import text_bytes

TASK = dict(vocab_size=64, seq_len=32, num_kv_pairs=4)
SIZES = {'train': 40, 'test': 10}


def write(folder):
  return mqar.write_splits(str(folder), seed=0, sizes=SIZES, verbose=False, **TASK)


def flip_inside(path, member='inputs.npy'):
  """Inverts some bytes in the middle of `member`'s compressed data: the zip's directory
  and the settings still read."""
  with zipfile.ZipFile(path) as z:
    info = z.getinfo(member)
  raw = bytearray(open(path, 'rb').read())
  start = info.header_offset + 30 + len(info.filename) + len(info.extra)
  for i in range(start + info.compress_size // 2, start + info.compress_size // 2 + 16):
    raw[i] ^= 0xFF
  open(path, 'wb').write(bytes(raw))


def shorten(path, rows):
  """The file with its first `rows` rows, and the settings it was written with."""
  with np.load(path) as z:
    kept = {k: z[k][:rows] if k != 'settings_json' else z[k] for k in z.files}
  npz_cache.save_npz(path, **kept)


def truncate(path):
  raw = open(path, 'rb').read()
  open(path, 'wb').write(raw[: len(raw) // 2])


@pytest.mark.parametrize(
  'damage, why',
  [
    (flip_inside, 'damaged ('),
    (truncate, 'damaged (File is not a zip file)'),
    (lambda p: shorten(p, 25), "its 'inputs' array is [25, 32], its settings say [40, 32]"),
  ],
)
def test_a_damaged_or_short_file_is_rebuilt_saying_so(damage, why, tmp_path, capsys):
  paths = write(tmp_path)
  with np.load(paths[0]) as z:
    before = {k: z[k] for k in ('inputs', 'labels')}
  stamp = os.stat(paths[1]).st_mtime_ns
  damage(paths[0])
  capsys.readouterr()
  assert write(tmp_path) == paths
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 1 and lines[0].startswith(f'{paths[0]}: {why}'), lines
  assert lines[0].endswith('; rebuilt: 40 MQAR examples written'), lines
  with np.load(paths[0]) as z:  # the same draw as before
    for key, value in before.items():
      np.testing.assert_array_equal(z[key], value)
  assert os.stat(paths[1]).st_mtime_ns == stamp  # the good split is kept
  assert (
    npz_cache.problem(
      paths[0], json.loads(bytes(np.load(paths[0])['settings_json'])), {'inputs': (40, 32)}
    )
    == ''
  )


def test_an_up_to_date_file_is_kept_silently(tmp_path, capsys):
  paths = write(tmp_path)
  stamps = [os.stat(p).st_mtime_ns for p in paths]
  capsys.readouterr()
  write(tmp_path)
  assert capsys.readouterr().out == ''
  assert [os.stat(p).st_mtime_ns for p in paths] == stamps


def test_a_file_found_whole_is_not_read_again_in_the_process(tmp_path, monkeypatch, capsys):
  """Every open of the data checks its cache: a file already checked whole is not read
  again while its size and modification time stay, and a change to it is still seen."""
  paths = write(tmp_path)
  write(tmp_path)  # checked whole once
  read = []
  real = npz_cache.read_bytes
  monkeypatch.setattr(npz_cache, 'read_bytes', lambda p: read.append(p) or real(p))
  assert write(tmp_path) == paths and read == []
  flip_inside(paths[0])
  capsys.readouterr()
  write(tmp_path)
  assert read and capsys.readouterr().out.startswith(f'{paths[0]}: damaged (')


def test_a_run_reads_the_rebuilt_file_from_the_data_cache(tmp_path, monkeypatch):
  """Through configs/mqar.py, its cache folder under a HOME of the test's own."""
  monkeypatch.setenv('HOME', str(tmp_path))
  monkeypatch.setattr(cache_folder, 'cache_dir', lambda name: str(tmp_path / '.cache' / name))
  config = mqar_config.get_config('linear,d_model=16,seq_len=32,num_kv_pairs=4,vocab_size=64')
  config.dataset.sizes = {'train': 40, 'validation': 10, 'test': 10}
  assert config.dataset.data_dir.startswith(str(tmp_path))
  assert len(arrays.get_split(config, 'train')) == 40
  sizes = config.dataset.sizes.to_dict()  # in the config's order
  path = mqar.split_path(config.dataset.data_dir, 'train', 64, 32, 4, 0.01, sizes=sizes)
  flip_inside(path)
  arrays.clear_cache()
  assert len(arrays.get_split(config, 'train')) == 40  # was: "... not a readable .npz file"
  shorten(path, 25)
  arrays.clear_cache()
  assert len(arrays.get_split(config, 'train')) == 40  # was: 25


# The other generated datasets: (write the splits into a folder, how many of what they hold).
def _corpus(folder):
  path = folder / 'corpus.txt'
  if not path.exists():
    path.write_bytes(
      b'\n\n'.join(b'Paragraph %d: some words, then more words.' % i for i in range(12))
    )
  return str(path)


OTHERS = {
  'listops': (
    lambda f: listops_files.write_splits(
      str(f), seed=0, sizes={'train': 6, 'test': 3}, max_length=60, min_length=10, verbose=False
    ),
    '6 ListOps examples written',
    'tokens.npy',
  ),
  'pathfinder': (
    lambda f: pathfinder.write_splits(
      str(f), seed=0, sizes={'train': 4, 'test': 2}, contour_length=6, verbose=False
    ),
    '4 Pathfinder images written',
    'x.npy',
  ),
  'text_bytes': (
    lambda f: text_bytes.write_splits(
      str(f / 'cache'), _corpus(f), seq_len=16, validation_docs=2, verbose=False
    ),
    ' windows of 16',
    'inputs.npy',
  ),
}


@pytest.mark.parametrize('name', list(OTHERS))
def test_the_other_generators_rebuild_a_damaged_file_saying_so(name, tmp_path, capsys):
  write_all, written, member = OTHERS[name]
  paths = write_all(tmp_path)
  with np.load(paths[0]) as z:
    before = {k: z[k] for k in z.files}
  flip_inside(paths[0], member)
  capsys.readouterr()
  assert write_all(tmp_path) == paths
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 1 and lines[0].startswith(f'{paths[0]}: damaged ('), lines
  assert '; rebuilt: ' in lines[0] and (lines[0].endswith(written) or written in lines[0]), lines
  with np.load(paths[0]) as z:  # the same draw as before
    for key, value in before.items():
      np.testing.assert_array_equal(z[key], value)
  capsys.readouterr()
  write_all(tmp_path)  # whole again: silent
  assert capsys.readouterr().out == ''


def test_a_short_listops_file_is_rebuilt(tmp_path, capsys):
  write_all, _, _ = OTHERS['listops']
  paths = write_all(tmp_path)
  shorten(paths[0], 4)
  capsys.readouterr()
  write_all(tmp_path)
  (line,) = capsys.readouterr().out.splitlines()
  assert line == (
    f"{paths[0]}: its 'tokens' array is [4, 60], its settings say [6, 60]; "
    'rebuilt: 6 ListOps examples written'
  )

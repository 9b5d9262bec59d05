"""Runs of other sizes or seeds share a generated dataset's cache folder, each with files of
its own (issue 70, item 1).

MQAR named its files by the task alone (vocabulary, length, pairs, power) and ListOps by
its lengths, so a run with another `num_train` or seed overwrote the files of a run beside
it, which then wrote them again, and so on. Their names now hold the key of everything
that makes them (`npz_cache.settings_key`), as the byte-LM windows' always did.
"""

import functools
import os
import subprocess
import sys

import numpy as np

from configs import mqar as mqar_config
from data import arrays
from data import listops_files
from data import pathfinder
from data import text_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK = 'linear,d_model=16,seq_len=32,num_kv_pairs=4,vocab_size=64'

# Another process: a run of `TASK` with the train size argv[2], its cache folder argv[1].
OTHER_RUN = f"""
import sys
from configs import mqar
from data import arrays
config = mqar.get_config('{TASK},num_train=' + sys.argv[2])
config.dataset.data_dir = sys.argv[1]
config.dataset.sizes.update(dict(validation=10, test=10))
print(len(arrays.get_split(config, 'train')))
"""


def stamps(folder):
  """{file name: modification time} of the folder's files."""
  return {name: os.stat(os.path.join(folder, name)).st_mtime_ns for name in os.listdir(folder)}


def test_mqar_runs_of_two_sizes_in_two_processes_each_keep_their_files(
  tmp_path, monkeypatch, capsys
):
  """This process trains on 40 examples, another on 30, then this one reads again: it finds
  its own 40, and nothing is written again (each rewrote the other's files)."""
  monkeypatch.setenv('EFFICIENT_ATTN_CACHE', str(tmp_path / 'cache'))
  folder = str(tmp_path / 'mqar')
  config = mqar_config.get_config(f'{TASK},num_train=40')
  config.dataset.data_dir = folder
  config.dataset.sizes.update(dict(validation=10, test=10))
  arrays.clear_cache()
  assert len(arrays.get_split(config, 'train')) == 40
  mine = stamps(folder)
  other = subprocess.run(
    [sys.executable, '-c', OTHER_RUN, folder, '30'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=True,
  )
  assert other.stdout.splitlines()[-1] == '30', other.stdout
  theirs = {name: stamp for name, stamp in stamps(folder).items() if name not in mine}
  assert len(mine) == len(theirs) == 3, (mine, theirs)  # their own three splits
  arrays.clear_cache()
  capsys.readouterr()
  assert len(arrays.get_split(config, 'train')) == 40
  assert capsys.readouterr().out == ''  # nothing written again
  assert stamps(folder) == {**mine, **theirs}


SIZED_RUNS = [  # other sizes, other seeds
  dict(seed=0, sizes={'train': 4, 'test': 2}),
  dict(seed=0, sizes={'train': 2, 'test': 2}),
  dict(seed=1, sizes={'train': 4, 'test': 2}),
]


def each_keeps_its_files(write, runs, folder, capsys):
  """Writes each run's splits (`write(**run)` -> paths) into `folder`: no run's files are
  another's, and a second pass returns the same paths with nothing written. The paths."""
  paths = [write(**run) for run in runs]
  assert len({p for run in paths for p in run}) == sum(map(len, paths))
  written = stamps(folder)
  capsys.readouterr()
  assert [write(**run) for run in runs] == paths
  assert capsys.readouterr().out == '' and stamps(folder) == written  # nothing written again
  return paths


def test_listops_runs_of_other_sizes_or_seeds_each_keep_their_files(tmp_path, capsys):
  write = functools.partial(
    listops_files.write_splits, str(tmp_path), verbose=False, max_length=60, min_length=10
  )
  for run, paths in zip(SIZED_RUNS, each_keeps_its_files(write, SIZED_RUNS, tmp_path, capsys)):
    assert len(listops_files._load_tokens(paths[0])) == run['sizes']['train']


def test_pathfinder_runs_of_other_sizes_or_seeds_each_keep_their_files(tmp_path, capsys):
  """Pathfinder's files were named by contour length and image size only (issue 70,
  item 1): runs of other sizes or seeds rewrote each other's splits."""
  write = functools.partial(
    pathfinder.write_splits, str(tmp_path), verbose=False, contour_length=6, image_size=16
  )
  for run, paths in zip(SIZED_RUNS, each_keeps_its_files(write, SIZED_RUNS, tmp_path, capsys)):
    with np.load(paths[0]) as split:
      assert len(split['y']) == run['sizes']['train']


def test_byte_lm_windows_of_other_settings_each_keep_their_files(tmp_path, capsys):
  """The byte-LM windows were named by the key of all their settings already: kept so."""
  corpus = tmp_path / 'corpus.txt'
  corpus.write_bytes(b'\n\n'.join(b'Paragraph %d, some words.' % i for i in range(12)))
  folder = tmp_path / 'cache'
  runs = [dict(train_docs=0), dict(train_docs=3), dict(train_docs=0, seed=1)]
  write = functools.partial(
    text_bytes.write_splits,
    str(folder),
    corpus=str(corpus),
    seq_len=16,
    validation_docs=2,
    verbose=False,
  )
  each_keeps_its_files(write, runs, folder, capsys)

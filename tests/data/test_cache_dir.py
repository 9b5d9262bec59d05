"""The cache folder (`data/cache_folder.py`): $EFFICIENT_ATTN_CACHE, else $XDG_CACHE_HOME,
else ~/.cache.

Every generated dataset (MQAR, the LRA tasks, a byte corpus's windows) is written
once under `cache_folder.cache_root()`; the configs store the folder in dataset.data_dir.
"""

import os

import pytest

from configs import common
from configs import mqar
from configs import presets
from configs.lra import listops
from data import cache_folder


@pytest.fixture
def env(monkeypatch, tmp_path):
  monkeypatch.delenv(cache_folder.CACHE_VARIABLE, raising=False)
  monkeypatch.delenv('XDG_CACHE_HOME', raising=False)
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  return monkeypatch


def test_the_default_is_the_home_folders_cache(env, tmp_path):
  assert cache_folder.cache_root() == str(tmp_path / 'home' / '.cache' / 'efficient_attn')


def test_xdg_cache_home_is_honoured_and_a_relative_one_ignored(env, tmp_path):
  env.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  assert cache_folder.cache_root() == str(tmp_path / 'xdg' / 'efficient_attn')
  env.setenv('XDG_CACHE_HOME', 'relative/cache')  # the XDG spec: ignore a relative path
  assert cache_folder.cache_root() == str(tmp_path / 'home' / '.cache' / 'efficient_attn')


def test_efficient_attn_cache_wins_over_xdg(env, tmp_path):
  env.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  env.setenv(cache_folder.CACHE_VARIABLE, str(tmp_path / 'mine'))
  assert cache_folder.cache_root() == str(tmp_path / 'mine')
  env.setenv(cache_folder.CACHE_VARIABLE, 'gs://bucket/cache')  # a bucket, as the data layer reads
  assert cache_folder.cache_root() == 'gs://bucket/cache'


def test_the_configs_write_their_data_under_it(env, tmp_path):
  env.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  root = str(tmp_path / 'xdg' / 'efficient_attn')
  assert mqar.get_config().dataset.data_dir == os.path.join(root, 'mqar')
  assert listops.get_config().dataset.data_dir == os.path.join(root, 'lra', 'listops')
  assert presets.text_bytes(common.base(), 'c.npz').dataset.data_dir == os.path.join(
    root, 'text_bytes'
  )

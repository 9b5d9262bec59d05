"""data/files.py: local data paths without TensorFlow; URLs through tf.io.gfile."""

import os
import subprocess
import sys

import pytest

from data import files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_local_npz_is_written_and_read_without_importing_tensorflow(tmp_path):
  """A generated dataset's cache and an .npz of the 'arrays' source are local files: a run
  on them needs no TensorFlow (a JAX-only GPU image has none). The check runs in a fresh
  interpreter, since this one may have imported TensorFlow for other tests."""
  path = str(tmp_path / 'x.npz')
  code = f"""
import json, sys
import numpy as np
from data import arrays, npz_cache
path = {path!r}
settings = np.frombuffer(json.dumps({{'a': 1}}).encode(), np.uint8)
npz_cache.save_npz(path, x=np.zeros((2, 3, 3, 1), np.uint8), y=np.array([0, 1]),
                   settings_json=settings)
assert npz_cache.problem(path, {{'a': 1}}) == ''
assert npz_cache.problem(path, {{'a': 2}}) == npz_cache.OTHER_SETTINGS
assert npz_cache.problem(path + '.missing', {{'a': 1}}) == 'missing'
split = arrays.read_npz(path)
assert split.labels.tolist() == [0, 1] and split.inputs.shape == (2, 3, 3, 1)
print('tensorflow' in sys.modules)
"""
  out = subprocess.run(
    [sys.executable, '-c', code],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env=dict(os.environ, CUDA_VISIBLE_DEVICES=''),
    check=False,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split()[-1] == 'False', 'TensorFlow was imported for a local file'
  assert not [n for n in os.listdir(tmp_path) if '.tmp' in n]  # written atomically


def test_local_rename_keeps_tf_gfile_semantics(tmp_path):
  src, dst = tmp_path / 'a', tmp_path / 'b'
  src.write_text('new')
  dst.write_text('old')
  gfile = files.gfile(str(src))
  with pytest.raises(FileExistsError, match='exists'):
    gfile.rename(str(src), str(dst))
  gfile.rename(str(src), str(dst), overwrite=True)
  assert dst.read_text() == 'new' and not src.exists()
  gfile.makedirs(str(tmp_path / 'c' / 'd'))
  gfile.makedirs(str(tmp_path / 'c' / 'd'))  # exists already: no error, as tf.io.gfile
  assert gfile.isdir(str(tmp_path / 'c')) and gfile.listdir(str(tmp_path / 'c')) == ['d']


def test_a_url_goes_through_tensorflow_gfile():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  assert files.is_url('gs://bucket/x.npz') and not files.is_url('/tmp/x.npz')
  assert files.gfile('gs://bucket/x.npz') is tf.io.gfile
  assert tf.errors.OpError in files.read_errors('gs://bucket/x.npz')
  assert files.read_errors('/tmp/x.npz') == (OSError,)

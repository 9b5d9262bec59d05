"""Shared settings and fixtures: XLA flags, float64 mode, a tiny ImageFolder, shared runs."""

import fcntl
import os
import shutil

import main_runner

# Before JAX starts its backend, which reads XLA_FLAGS once: the tests' compile flags
# (main_runner.XLA_FLAGS says why), ahead of any the caller set, so that theirs win.
# xdist workers inherit them from the controller.
if main_runner.XLA_FLAGS not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f"{main_runner.XLA_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np
import pytest

main_runner.share_compilation_cache()

# The tests compare float32 results with float64 references at float32 tolerances. On a
# GPU or TPU, float32 matmuls default to TF32 / bfloat16 passes, which such a tolerance
# rightly rejects; full precision there makes the suite's checks the same on every
# platform (no effect on CPU).
jax.config.update('jax_default_matmul_precision', 'highest')


@pytest.fixture(autouse=True)
def fresh_data_cache():
  """In-memory datasets are cached per process; a test may mock TFDS differently.

  Where only the library is installed (no TensorFlow: an accelerator machine
  running the library's tests), there is no cache to clear.
  """
  try:
    from data import arrays  # pylint: disable=g-import-not-at-top
  except ImportError:
    yield
    return
  arrays.clear_cache()
  yield


@pytest.fixture
def x64():
  """Float64 inside one test only, so it never leaks into other tests of the process."""
  with jax.enable_x64(True):
    yield


def write_image_folder(root, splits=(('train', 6), ('test', 3)), labels=('cat', 'dog')):
  """root/<split>/<label>/<i>.png, random RGB images of a few sizes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  for split, n in splits:
    for label in labels:
      os.makedirs(os.path.join(root, split, label), exist_ok=True)
      for i in range(n):
        h, w = rng.integers(20, 40, size=2)
        image = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        tf.io.write_file(os.path.join(root, split, label, f'{i}.png'), tf.io.encode_png(image))
  return root


def write_aan_folder(root, sizes=(('train', 6), ('eval', 4), ('test', 4))):
  """root/new_aan_pairs.<split>.tsv as LRA releases them: label, ids, two b'...' texts."""
  rng = np.random.default_rng(0)
  os.makedirs(root, exist_ok=True)
  for split, n in sizes:
    with open(os.path.join(root, f'new_aan_pairs.{split}.tsv'), 'w') as f:
      for i in range(n):
        words = [
          ' '.join(rng.choice(['attention', 'parsing', 'corpus', 'model'], size=k))
          for k in rng.integers(1, 12, size=2)
        ]
        f.write(f"{float(i % 2)}\tP{i}\tQ{i}\tb'{words[0]}'\tb'{words[1]}'\n")
  return root


@pytest.fixture(scope='session')
def image_folder_root(tmp_path_factory):
  return write_image_folder(str(tmp_path_factory.mktemp('image_folder')))


@pytest.fixture(scope='session')
def run_once(tmp_path_factory):
  """`run_once(name, fn)` calls `fn(workdir)` once per test session and returns workdir.

  Under pytest-xdist the workers share the directory (the first one runs, the
  others wait on a file lock), so an expensive training run is not repeated
  by every worker that needs it.
  """
  base = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    base = base.parent  # the session's directory, shared by its workers

  def run(name, fn):
    workdir = base / f'shared_{name}'
    with open(f'{workdir}.lock', 'w') as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      try:
        if not (base / f'shared_{name}.done').exists():
          shutil.rmtree(workdir, ignore_errors=True)
          workdir.mkdir()
          fn(str(workdir))
          (base / f'shared_{name}.done').touch()
      finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
    return str(workdir)

  return run

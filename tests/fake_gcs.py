"""A fake `gs://` for tests: every `gs://bucket/path` lives under a local folder.

    with fake_gcs.installed(monkeypatch, root) as local:
      trainer.train_and_evaluate(config, 'gs://bucket/run')
      assert (local('gs://bucket/run') / 'results.json').exists()

Only the storage layers are redirected, each where a real bucket would be
reached; everything above them sees and handles real `gs://` strings:
- epath (our workdir I/O, and Orbax's) goes through its fsspec backend, here
  an fsspec filesystem rooted at `root` (as gcsfs would be at the bucket);
- Orbax's array data goes through TensorStore, whose GCS kvstore is pointed
  at the same folder, and Orbax's bucket-layout query says "flat bucket";
- TensorBoard events go through `tf.summary`, whose file writer gets the same
  folder (TF's own GCS filesystem would need network access).
A code path that used a `gs://` path with plain `open()` / `os` calls would
create a local `gs:` folder or fail: the tests check that neither happens.
"""

import contextlib
import importlib
import os
import pathlib

from fsspec.implementations import dirfs
from fsspec.implementations import local as local_fs

PREFIX = 'gs://'
# The module; `fsspec.registry` is a read-only view of its table.
fsspec_registry = importlib.import_module('fsspec.registry')


class _FakeGCS(dirfs.DirFileSystem):
  """gs://<path> <-> <root>/<path>; the root is set by `installed`."""

  protocol = ('gs', 'gcs')
  cachable = False
  root = ''

  def __init__(self, *args, **kwargs):
    del args, kwargs  # gcsfs options
    super().__init__(path=_FakeGCS.root, fs=local_fs.LocalFileSystem())


@contextlib.contextmanager
def installed(monkeypatch, root):
  """Routes gs:// to `root` for the duration; yields `local(gs_path) -> Path`."""
  from etils.epath import backend  # pylint: disable=g-import-not-at-top
  from etils.epath import gpath  # pylint: disable=g-import-not-at-top
  from orbax.checkpoint._src.path import gcs_utils  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(root)
  root.mkdir(parents=True, exist_ok=True)

  def local(path) -> pathlib.Path:
    path = os.fspath(path)
    assert path.startswith(PREFIX), path
    return root / path[len(PREFIX) :]

  monkeypatch.setattr(_FakeGCS, 'root', str(root))
  for protocol in _FakeGCS.protocol:
    registry = fsspec_registry._registry  # pylint: disable=protected-access
    monkeypatch.setitem(registry, protocol, _FakeGCS)
  # epath picks TensorFlow's gfile for gs:// when TF is installed; use fsspec.
  monkeypatch.setattr(gpath, '_is_tf_installed', lambda: False)
  type(backend.fsspec_backend)._get_filesystem.cache_clear()  # pylint: disable=protected-access
  monkeypatch.setattr(gcs_utils, 'is_hierarchical_namespace_enabled', lambda path: False)
  monkeypatch.setattr(
    gcs_utils,
    'get_kvstore_for_gcs',
    lambda path: {'driver': 'file', 'path': os.fspath(local(path))},
  )
  create_file_writer = tf.summary.create_file_writer

  def file_writer(logdir, *args, **kwargs):
    logdir = os.fspath(logdir)
    if logdir.startswith(PREFIX):
      logdir = os.fspath(local(logdir))
    return create_file_writer(logdir, *args, **kwargs)

  monkeypatch.setattr(tf.summary, 'create_file_writer', file_writer)
  try:
    yield local
  finally:
    type(backend.fsspec_backend)._get_filesystem.cache_clear()  # pylint: disable=protected-access

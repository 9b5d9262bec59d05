"""What a command-line run logs: absl's warnings, without JAX's missing-TPU notice or
TensorFlow's start-up notices.

    logs.quiet_logs(flags.FLAGS['verbosity'].present)   # first thing in an app's main
    logs.quiet_tensorflow_import()                       # TensorFlow, when it loads, quietly

`main.py` and the scripts under `examples/` call it, so none of them prints JAX's
"Unable to initialize backend 'tpu'" notice on a machine without libtpu.
"""

import contextlib
import importlib
import importlib.abc
import importlib.util
import logging as std_logging
import os
import re
import sys
import tempfile

from absl import logging

TPU_NOTICE = "Unable to initialize backend 'tpu'"
# What TensorFlow's C++ libraries write to stderr when they load, whatever
# TF_CPP_MIN_LOG_LEVEL says (TensorFlow 2.21): absl's notice that logging is not yet
# initialised, oneDNN's notice and the CPU-feature notice (two lines).
TENSORFLOW_NOTICES = re.compile(
  r'All log messages before absl::InitializeLog|oneDNN custom operations are on|'
  r'cpu_feature_guard|^To enable the following instructions'
)


class NoMissingTpuNotice(std_logging.Filter):
  """Drops JAX's "Unable to initialize backend 'tpu'" notice (libtpu is not installed, so
  there is no TPU to miss); every other record, and the notice on a machine with libtpu,
  passes."""

  def filter(self, record):
    return not record.getMessage().startswith(TPU_NOTICE)


def quiet_logs(verbosity_given: bool) -> None:
  """absl logs warnings and errors only (the progress lines go to stdout), unless the
  user chose a --verbosity; JAX's notice about a missing TPU backend goes without libtpu."""
  if not verbosity_given:
    logging.set_verbosity(logging.WARNING)
  if importlib.util.find_spec('libtpu') is None:
    jax_logger = std_logging.getLogger('jax._src.xla_bridge')
    if not any(isinstance(f, NoMissingTpuNotice) for f in jax_logger.filters):
      jax_logger.addFilter(NoMissingTpuNotice())


@contextlib.contextmanager
def _tensorflow_notices_dropped():
  """File descriptor 2 points at a temporary file in the block; its lines, less
  `TENSORFLOW_NOTICES`, are written to stderr after it. (The notices come from C++, where
  no Python logger sees them.)"""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      lines = captured.read().decode(errors='replace').splitlines()
      kept = [line for line in lines if not TENSORFLOW_NOTICES.search(line)]
      if kept:
        sys.stderr.write('\n'.join(kept) + '\n')


class _QuietLoader(importlib.abc.Loader):
  """TensorFlow's own loader, run with its start-up notices dropped."""

  def __init__(self, loader):
    self.loader = loader

  def create_module(self, spec):
    return self.loader.create_module(spec)

  def exec_module(self, module):
    with _tensorflow_notices_dropped():
      self.loader.exec_module(module)

  def __getattr__(self, name):  # resource readers and the like: TensorFlow's loader's
    return getattr(self.loader, name)


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
  """Finds TensorFlow the first time anything imports it, and hands it `_QuietLoader`."""

  def find_spec(self, name, path=None, target=None):
    if name != 'tensorflow':
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.loader is not None:
      spec.loader = _QuietLoader(spec.loader)
    return spec


def quiet_tensorflow_import() -> None:
  """Whatever imports TensorFlow later (TFDS, tf.data, an image decoder) imports it with its
  start-up notices (`TENSORFLOW_NOTICES`) left out of stderr, every other line passed on;
  a run that needs no TensorFlow never loads it (about 8 s of CPU). A no-op once it is
  imported or the finder is in place."""
  if 'tensorflow' in sys.modules or any(
    isinstance(finder, _QuietTensorFlowFinder) for finder in sys.meta_path
  ):
    return
  sys.meta_path.insert(0, _QuietTensorFlowFinder())

"""What a command-line run logs: absl's warnings, without JAX's missing-TPU notice or
TensorFlow's start-up notices.

    logs.quiet_logs(flags.FLAGS['verbosity'].present)   # first thing in an app's main
    logs.import_tensorflow_quietly()                     # before the data or clu need it

`main.py` and the scripts under `examples/` call it, so none of them prints JAX's
"Unable to initialize backend 'tpu'" notice on a machine without libtpu.
"""

import importlib
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


def import_tensorflow_quietly():
  """Imports TensorFlow with its start-up notices (`TENSORFLOW_NOTICES`) left out of stderr;
  every other line it writes while loading is passed on. A no-op once it is imported.

  The notices come from C++ (file descriptor 2), where no Python logger sees them, so the
  descriptor points at a temporary file during the import and its lines are filtered.
  """
  if 'tensorflow' in sys.modules:
    return sys.modules['tensorflow']
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      return importlib.import_module('tensorflow')
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      lines = captured.read().decode(errors='replace').splitlines()
      kept = [line for line in lines if not TENSORFLOW_NOTICES.search(line)]
      if kept:
        sys.stderr.write('\n'.join(kept) + '\n')

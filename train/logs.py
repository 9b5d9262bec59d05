"""What a command-line run logs: absl's warnings, without JAX's missing-TPU notice.

    logs.quiet_logs(flags.FLAGS['verbosity'].present)   # first thing in an app's main

`main.py` and the scripts under `examples/` call it, so none of them prints JAX's
"Unable to initialize backend 'tpu'" notice on a machine without libtpu.
"""

import importlib.util
import logging as std_logging

from absl import logging

TPU_NOTICE = "Unable to initialize backend 'tpu'"


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

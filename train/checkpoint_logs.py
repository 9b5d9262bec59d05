"""Orbax's log output, cut to what a user needs: `quiet_orbax_logging()`.

Orbax logs tens of INFO lines per save, and a full disk as a traceback from each
background thread of the failed save, then tens more when TensorStore writes finish after
Orbax closed the save's event loop. `checkpoint.Checkpointer` reports such a failure as
one CheckpointSaveError; these are left out of the log.
"""

import logging as logging_std
import os
import sys

from train import workdir as workdir_lib


class _OrbaxInfoFilter(logging_std.Filter):
  """Drops Orbax's INFO chatter (tens of lines per save) from the absl log, and its
  reports of a full disk (a traceback from each background thread of the failed save):
  `Checkpointer` raises that failure as one CheckpointSaveError."""

  def filter(self, record):
    if f'{os.sep}orbax{os.sep}' not in record.pathname:
      return True
    if record.levelno <= logging_std.INFO:
      return False
    return not workdir_lib.is_disk_full(
      record.exc_info[1] if record.exc_info else record.getMessage()
    )


def _late_callback(unraisable) -> bool:
  """Whether `unraisable` (sys.unraisablehook's argument) is a TensorStore write finishing
  after Orbax closed the event loop of a save that had already failed (a full disk: tens
  of tracebacks, 'RuntimeError: Event loop is closed'; the save's error is reported)."""
  tb = unraisable.exc_traceback
  while tb is not None and tb.tb_next is not None:
    if tb.tb_frame.f_code.co_name == 'call_soon_threadsafe':
      break
    tb = tb.tb_next
  return (
    isinstance(unraisable.exc_value, RuntimeError)
    and tb is not None
    and str(unraisable.exc_value) == 'Event loop is closed'
    and tb.tb_frame.f_code.co_name == 'call_soon_threadsafe'
  )


def quiet_orbax_logging() -> None:
  """Installs the filter on absl's logger and the hook on sys.unraisablehook, once."""
  logger = logging_std.getLogger('absl')
  if not any(isinstance(f, _OrbaxInfoFilter) for f in logger.filters):
    logger.addFilter(_OrbaxInfoFilter())
  hook = sys.unraisablehook
  if not getattr(hook, 'drops_late_callbacks', False):

    def quiet_hook(unraisable):
      if not _late_callback(unraisable):
        hook(unraisable)

    quiet_hook.drops_late_callbacks = True
    sys.unraisablehook = quiet_hook

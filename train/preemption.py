"""SIGTERM or Ctrl-C (SIGINT) -> "save a checkpoint at the current step and exit cleanly".

    with preemption.StopOnSignal() as stop:
      for step in ...:
        ...
        if stop.requested: save(step); break

The handler only sets a flag (the loop acts on it between steps). A second
Ctrl-C is not waited for: it gets the handler that was there before (Python's
KeyboardInterrupt). Outside the main thread signal handlers cannot be installed
and the flag stays False.
"""

import signal
import threading

from absl import logging


class StopOnSignal:
  """Context manager that turns the given signals into `self.requested = True`."""

  def __init__(self, signals=(signal.SIGTERM, signal.SIGINT), enabled: bool = True):
    self.signals = tuple(signals) if enabled else ()
    self.requested = False
    self.signal_name = ''
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if not self.requested:  # the first signal names the stop (a sweep adds SIGTERM to Ctrl-C)
      self.signal_name = signal.Signals(signum).name
    self.requested = True
    if signum == signal.SIGINT:  # a second Ctrl-C interrupts at once
      signal.signal(signum, self._previous.get(signum, signal.default_int_handler))
    logging.warning(
      'Received %s: will save a checkpoint after the current step and exit%s',
      signal.Signals(signum).name,
      ' (Ctrl-C again: stop now)' if signum == signal.SIGINT else '',
    )

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for sig in self.signals:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
    return False

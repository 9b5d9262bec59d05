"""The training loop's progress scalars: steps per second and uptime, every few steps.

    report = progress.ReportProgress(num_train_steps=660, writer=writer, every_steps=50)
    for step in range(1, 661):
      ...
      report(step)                 # at steps 50, 100, ...: 'steps_per_sec', 'uptime'
      with report.timed('eval'):   # the share of time each part took, in the logged note
        ...

clu's `periodic_actions.ReportProgress`, as the trainer uses it (every `every_steps`
steps; the first call only starts the clock), without clu's import of TensorFlow.
"""

import collections
import contextlib
import time
from typing import Dict, Optional

from absl import logging


def _format_seconds(seconds: float) -> str:
  """'1h2m', '3m', '45s' (clu's format)."""
  if seconds < 60:
    return f'{int(seconds)}s'
  hours, minutes = divmod(int(seconds / 60), 60)
  return f'{hours}h{minutes}m' if hours else f'{minutes}m'


class ReportProgress:
  """Called after every step; every `every_steps` steps writes 'steps_per_sec' (since the
  previous report) and 'uptime' (seconds since it was made) and logs a one-line note."""

  def __init__(self, *, num_train_steps: int, writer, every_steps: int):
    self.num_train_steps, self.writer, self.every_steps = num_train_steps, writer, every_steps
    self.started = time.monotonic()
    self.previous: Optional[tuple] = None  # (step, time) of the first call or last report
    self.time_per_part: Dict[str, float] = collections.defaultdict(float)

  def __call__(self, step: int) -> bool:
    """True when it reported at `step` (never at the first call)."""
    now = time.monotonic()
    if self.previous is None:
      self.previous = (step, now)
      return False
    previous_step, previous_time = self.previous
    if step == previous_step or step % self.every_steps:
      return False
    steps_per_sec = (step - previous_step) / max(now - previous_time, 1e-9)
    eta = (self.num_train_steps - step) / steps_per_sec
    note = (
      f'{steps_per_sec:.1f} steps/s, {100 * step / self.num_train_steps:.1f}% '
      f'({step}/{self.num_train_steps}), ETA: {_format_seconds(eta)}'
    )
    if self.time_per_part:
      total = now - self.started
      shares = sorted(self.time_per_part.items())
      parts = ', '.join(f'{100 * seconds / total:.1f}% {name}' for name, seconds in shares)
      note += f' ({_format_seconds(total)} : {parts})'
    logging.info('Progress: %s', note)
    self.writer.write_scalars(step, {'steps_per_sec': steps_per_sec})
    self.writer.write_scalars(step, {'uptime': now - self.started})
    self.previous = (step, now)
    return True

  @contextlib.contextmanager
  def timed(self, name: str):
    """Adds the block's wall time to part `name`."""
    began = time.monotonic()
    try:
      yield
    finally:
      self.time_per_part[name] += time.monotonic() - began

"""The training loop's clock: measured epoch times and the steady step rate."""

import contextlib
import time
from typing import Optional

import numpy as np


class Clock:
  """Measured epoch times: wall time between epoch boundaries, eval and saving excluded;
  and the steady step rate: every step after the first (which compiles), the same excluded.

  Excluded ('paused'): evaluation, checkpoint saving and writing the logged metrics (whose
  first call compiles the learning-rate schedule's ops, ~1.5 s on a CPU). The steady rate
  times batch size is the 'ex/s' of every progress line and results.json's
  `steady_examples_per_sec`; the median epoch time gives its `examples_per_sec`."""

  def __init__(self, steps_per_epoch: int):
    self.steps_per_epoch = steps_per_epoch
    self.epochs = []  # seconds of each whole epoch run here (the first compiles)
    self._start, self._excluded, self._steps = time.monotonic(), 0.0, 0
    self._first = None  # time of the first tick, and pauses since then
    self._paused_total, self._steady = 0.0, (0, 0.0)  # (steps, seconds) at the last tick

  def tick(self, step: int) -> None:
    now = time.monotonic()
    if self._first is None:
      self._first, self._paused_total = now, 0.0
    else:
      self._steady = (self._steady[0] + 1, now - self._first - self._paused_total)
    self._steps += 1
    if step % self.steps_per_epoch == 0:
      if self._steps == self.steps_per_epoch:
        self.epochs.append(now - self._start - self._excluded)
      self._start, self._excluded, self._steps = now, 0.0, 0

  @contextlib.contextmanager
  def paused(self):
    t0 = time.monotonic()
    yield
    paused = time.monotonic() - t0
    self._excluded += paused
    self._paused_total += paused

  def steady_steps_per_sec(self) -> Optional[float]:
    """Steps per second over every step after the first (from the end of the first step to
    the last tick), the paused time excluded (None: one step)."""
    steps, seconds = self._steady
    return steps / seconds if steps and seconds > 0 else None

  def epoch_time(self) -> Optional[float]:
    """Median measured epoch time, leaving out the first (compiling) epoch when possible."""
    times = self.epochs[1:] or self.epochs
    return float(np.median(times)) if times else None

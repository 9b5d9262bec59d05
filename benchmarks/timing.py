"""Timing a compiled call, and the log-log fits that extrapolate times and summarise how
time and memory grow with the length."""

import math
import statistics
import time
from typing import Any, Callable, Dict, Optional, Sequence

import jax
import numpy as np


def block(x):
  return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, 'block_until_ready') else a, x)


def time_compiled(
  compiled: Callable[..., Any], args: Sequence[Any], *, repeats: int, budget_s: float
) -> Dict[str, Any]:
  """Median (and minimum) wall time of `compiled(*args)` after one warm-up call.

  Runs the warm-up, then up to `repeats` timed calls, stopping early once the
  timed calls have used half of `budget_s` (at least one timed call). If the
  warm-up alone exceeds the budget, it is reported as the single measurement
  (`from_warmup=True`): for calls that long, first-call overhead is negligible.
  Every call is followed by `block_until_ready`.
  """
  start = time.perf_counter()
  block(compiled(*args))
  warmup = time.perf_counter() - start
  times = []
  if warmup > budget_s:
    times, from_warmup = [warmup], True
  else:
    from_warmup = False
    while len(times) < max(1, repeats):
      start = time.perf_counter()
      block(compiled(*args))
      times.append(time.perf_counter() - start)
      if sum(times) > budget_s / 2:
        break
  return dict(
    time_s=statistics.median(times),
    min_s=min(times),
    times_s=times,
    warmup_s=warmup,
    runs=len(times),
    from_warmup=from_warmup,
  )


def predict_time(
  lengths: Sequence[int], times: Sequence[float], length: int, default_exponent: float = 2.0
) -> Optional[float]:
  """Extrapolates time to `length` from earlier (length, time) points.

  Uses the log-log slope of the last two points (clipped to [1, 2.5]), or
  `default_exponent` with one point; None with none.
  """
  if not lengths:
    return None
  exponent = default_exponent
  if len(lengths) >= 2 and lengths[-1] != lengths[-2] and times[-2] > 0:
    exponent = math.log(times[-1] / times[-2]) / math.log(lengths[-1] / lengths[-2])
    exponent = min(max(exponent, 1.0), 2.5)
  return times[-1] * (length / lengths[-1]) ** exponent


def fit_exponent(
  xs: Sequence[float], ys: Sequence[float], lo: Optional[float] = None, hi: Optional[float] = None
) -> Optional[float]:
  """Least-squares slope of log(y) against log(x) over points with lo <= x <= hi.

  None if fewer than two usable points (missing or non-positive values are dropped).
  """
  pts = [
    (x, y)
    for x, y in zip(xs, ys)
    if y is not None and y > 0 and (lo is None or x >= lo) and (hi is None or x <= hi)
  ]
  if len({x for x, _ in pts}) < 2:
    return None
  lx = np.log([x for x, _ in pts])
  ly = np.log([y for _, y in pts])
  return float(np.polyfit(lx, ly, 1)[0])

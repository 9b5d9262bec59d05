"""benchmarks.scale's search: the longest length whose compiled step fits the per-device
budget, for each device count of one mechanism."""

from typing import Any, Dict, List, Optional, Sequence

from benchmarks import output
from benchmarks import scale_communication
from benchmarks import scale_step
from benchmarks import xla_stats


class Search:
  """The per-device memory of (mechanism, devices, blocks per device), compiled once each."""

  def __init__(self, mechanism: str, devices: int, fv, log):
    self.mechanism, self.devices, self.fv, self.log = mechanism, devices, fv, log
    self.memory: Dict[int, Optional[int]] = {}
    self.errors: Dict[int, str] = {}
    self.compiled: Dict[int, Any] = {}  # k -> (compiled step, run) of the lengths that fit

  def length(self, k: int) -> int:
    return k * self.devices * self.fv.block

  def fits(self, k: int) -> bool:
    if k not in self.memory:
      try:
        compiled, run = scale_step.compiled_step(
          self.mechanism, self.length(k), self.devices, self.fv
        )
        self.memory[k] = (xla_stats.memory(compiled) or {}).get('total')
        if self.memory[k] is not None and self.memory[k] <= self.fv.budget_mib * 2**20:
          self.compiled = (
            {k: (compiled, run)} if k > max(self.compiled, default=0) else (self.compiled)
          )
      except Exception as e:  # pylint: disable=broad-except  (a length the mechanism refuses)
        self.memory[k], self.errors[k] = None, str(e).strip().splitlines()[0]
      self.log(
        f'  {self.mechanism} on {self.devices}: {self.length(k)} tokens: '
        + (output.fmt_bytes(self.memory[k]) if self.memory[k] is not None else self.errors[k])
      )
    return self.memory[k] is not None and self.memory[k] <= self.fv.budget_mib * 2**20

  def predicted(self) -> int:
    """A first guess at the longest k: memory extrapolated linearly from k = 1 and 2."""
    if self.fv.max_blocks < 2 or not self.fits(1):
      return 1
    self.fits(2)
    m1, m2 = self.memory[1], self.memory.get(2)
    if m2 is None or m2 <= m1:
      return 1 if m2 is None else 2
    return max(1, int(1 + (self.fv.budget_mib * 2**20 - m1) / (m2 - m1)))

  def longest(self, hint: Optional[int] = None) -> Optional[int]:
    """The largest k (blocks per device) that fits, searching from `hint` (default: the
    linear extrapolation of k = 1 and 2); None if none."""
    hint = max(1, min(self.predicted() if hint is None else hint, self.fv.max_blocks))
    if self.fits(hint):
      lo, step = hint, 1
      while lo + step <= self.fv.max_blocks and self.fits(lo + step):
        lo, step = lo + step, step * 2
      hi = min(lo + step, self.fv.max_blocks + 1)
    else:
      hi, step = hint, 1
      while hi - step >= 1 and not self.fits(hi - step):
        hi, step = hi - step, step * 2
      lo = hi - step
      if lo < 1:
        if not self.fits(1):
          return None
        lo = 1
    while hi - lo > 1:  # lo fits, hi does not (or is past the search)
      mid = (lo + hi) // 2
      lo, hi = (mid, hi) if self.fits(mid) else (lo, mid)
    return lo


def measure_mechanism(mechanism: str, devices: Sequence[int], fv, log) -> List[Dict[str, Any]]:
  """A row per device count: the longest length that fits, its memory and the next
  length's, its step time and the bytes sent (or the error of the shortest length)."""
  rows, hint, base = [], None, None
  for n in devices:
    search = Search(mechanism, n, fv, log)
    k = search.longest(hint)
    if k is None:
      first = next(iter(search.errors.values()), 'the shortest length exceeds the budget')
      rows.append(dict(mechanism=mechanism, devices=n, error=first))
      continue
    hint, length = k, search.length(k)
    if n == 1:
      base = length
    compiled, run = search.compiled[k]
    comm = scale_communication.communication(compiled.as_text(), n)
    seconds = scale_step.time_steps(compiled, run, length, fv.repeats)
    rows.append(
      dict(
        mechanism=mechanism,
        devices=n,
        length=length,
        per_device=length // n,
        vs_one=length / base if base else None,
        memory_bytes=search.memory[k],
        next_length=search.length(k + 1),
        next_memory_bytes=search.memory.get(k + 1),
        next_error=search.errors.get(k + 1),
        step_s=seconds,
        comm_bytes=comm,
        compiles=len(search.memory),
      )
    )
    log(
      f'{mechanism} on {n} device(s): {length} tokens '
      f'({output.fmt_bytes(search.memory[k])} per device)'
      + (f', {seconds:.3g} s per step' if seconds else '')
    )
  return rows

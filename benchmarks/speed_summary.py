"""benchmarks.speed's summary of the measured points: fitted scaling exponents, ratios to
exact attention and the --compare ratios."""

from typing import Any, Dict, Optional, Sequence, Tuple

from benchmarks import attention_bench
from benchmarks import timing


def point_value(points, target, mode, n, key='time_s'):
  """`key` of the measured point of `target`, `mode` and length `n`; None if not measured."""
  for p in points:
    if p['target'] == target and p['mode'] == mode and p['length'] == n and p['status'] == 'ok':
      return p.get(key)
  return None


def compare_ratios(points, compare: Sequence[Tuple[str, str]], modes) -> Dict[str, Any]:
  """'a:b:mode' -> {length: time(a) / time(b)} at every length both measured."""
  out = {}
  for a, b in compare:
    for mode in modes:
      ratios = {}
      for n in sorted({p['length'] for p in points}):
        ta, tb = point_value(points, a, mode, n), point_value(points, b, mode, n)
        if ta and tb:
          ratios[n] = ta / tb
      out[f'{a}:{b}:{mode}'] = ratios
  return out


def summarise(points, targets, modes, fit_lo, fit_hi) -> Dict[str, Any]:
  """Per target and mode: fitted exponents and ratios to exact at each length."""
  out: Dict[str, Any] = {}
  for target in targets:
    for mode in modes:
      ok = [
        p for p in points if p['target'] == target and p['mode'] == mode and p['status'] == 'ok'
      ]
      ns = [p['length'] for p in ok]
      entry = dict(
        time_exponent=timing.fit_exponent(ns, [p['time_s'] for p in ok], fit_lo, fit_hi),
        memory_exponent=timing.fit_exponent(ns, [p['memory_bytes'] for p in ok], fit_lo, fit_hi),
        fit_lengths=[n for n in ns if fit_lo <= n <= fit_hi],
        speedup_vs_exact={},
        memory_ratio_vs_exact={},
      )
      for p in ok:
        t_exact = point_value(points, attention_bench.EXACT, mode, p['length'])
        m_exact = point_value(points, attention_bench.EXACT, mode, p['length'], 'memory_bytes')
        if t_exact:
          entry['speedup_vs_exact'][p['length']] = t_exact / p['time_s']
        if m_exact and p.get('memory_bytes'):
          entry['memory_ratio_vs_exact'][p['length']] = p['memory_bytes'] / m_exact
      out[f'{target}:{mode}'] = entry
  return out


def no_speedup(summary, targets, modes) -> Optional[str]:
  """One line saying why there is no speedup plot (time of exact / time), or None when
  'exact' was measured at some length."""
  if any(summary[f'{t}:{m}']['speedup_vs_exact'] for t in targets for m in modes):
    return None
  why = (
    "'exact' is not among the targets"
    if attention_bench.EXACT not in targets
    else "'exact' was not measured at any length (see the points not measured)"
  )
  return f'no speedup plot or table (time of exact / time of the target): {why}.'

"""What XLA says about a compiled function: memory, FLOPs, and loop-corrected FLOPs.

`compiled = jax.jit(f).lower(*args).compile()`, then:

  memory(compiled)  argument + output + temp - alias bytes of the executable
                    (XLA's buffer assignment: the peak the program needs, not
                    counting the runtime's own overhead).
  flops(compiled)   XLA's cost analysis. XLA's HloCostAnalysis counts the body
                    of a `while` loop (lax.scan, lax.map, fori_loop) ONCE, not
                    once per iteration, so for looped programs it undercounts.
  loop_flops(text)  matmul (dot) FLOPs parsed from the compiled HLO text with
                    each loop body multiplied by its known trip count; the
                    difference with the once-per-body count is what
                    `flops_corrected` adds back.
"""
import math
import re
from typing import Any, Dict, Optional, Tuple


def memory(compiled) -> Optional[Dict[str, int]]:
  """Byte counts from `compiled.memory_analysis()`, with 'total'; None if unavailable."""
  try:
    stats = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except  (not implemented on some backends)
    return None
  if stats is None:
    return None
  if isinstance(stats, (list, tuple)):
    stats = stats[0]
  fields = ('argument_size_in_bytes', 'output_size_in_bytes', 'temp_size_in_bytes',
            'alias_size_in_bytes', 'generated_code_size_in_bytes')
  out = {f.replace('_size_in_bytes', ''): int(getattr(stats, f, 0) or 0) for f in fields}
  out['total'] = out['argument'] + out['output'] + out['temp'] - out['alias']
  return out


def cost(compiled) -> Dict[str, float]:
  """`compiled.cost_analysis()` as one dict (older jax returns a list of dicts)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    merged: Dict[str, float] = {}
    for part in analysis:
      for key, value in (part or {}).items():
        merged[key] = merged.get(key, 0.0) + value
    analysis = merged
  return dict(analysis or {})


def flops(compiled) -> Dict[str, Any]:
  """FLOPs of a compiled function.

  Returns dict with
    flops_xla: XLA's cost analysis ('flops');
    flops: flops_xla plus the dot FLOPs of loop iterations beyond the first
      (equal to flops_xla when the program has no loops);
    loops: number of while loops; unknown_trip_counts: loops whose trip count
      XLA did not record (counted once).
  """
  xla = float(cost(compiled).get('flops', float('nan')))
  once, repeated, loops, unknown = loop_flops(compiled.as_text())
  return dict(flops_xla=xla, flops=xla + max(0.0, repeated - once), loops=loops,
              unknown_trip_counts=unknown)


# ----------------------------------------------------------------------------
# Dot FLOPs from HLO text, with loop trip counts.
# ----------------------------------------------------------------------------

_COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->.*\{\s*$')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\]')
_PARAM = re.compile(r'%?([\w.\-]+):\s*\w+\[([\d,]*)\]')
_DOT = re.compile(r'\sdot\(\s*%?([\w.\-]+)[^,]*,.*lhs_contracting_dims=\{([\d,]*)\}')
_CALLEE = re.compile(r'\b(calls|body|to_apply)=%?([\w.\-]+)')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _dims(text: str) -> Tuple[int, ...]:
  return tuple(int(d) for d in text.split(',') if d)


def _parse(hlo: str):
  """{computation: (own dot flops, [(callee, multiplier or None)])} and the entry name."""
  comps: Dict[str, Any] = {}
  entry = None
  name = None
  shapes: Dict[str, Tuple[int, ...]] = {}
  for line in hlo.splitlines():
    m = _COMPUTATION.match(line)
    if m:
      name = m.group(1)
      if line.startswith('ENTRY'):
        entry = name
      shapes = {p: _dims(d) for p, d in _PARAM.findall(m.group(2))}
      comps[name] = [0.0, []]
      continue
    if name is None:
      continue
    if line.strip() == '}':
      name = None
      continue
    inst = _INSTRUCTION.match(line)
    if inst:
      shapes[inst.group(1)] = _dims(inst.group(3))
    dot = _DOT.search(line)
    if inst and dot and dot.group(1) in shapes:
      lhs = shapes[dot.group(1)]
      contract = math.prod(lhs[i] for i in _dims(dot.group(2)))
      comps[name][0] += 2.0 * math.prod(_dims(inst.group(3))) * contract
    trip = _TRIP.search(line)
    for kind, callee in _CALLEE.findall(line):
      if kind == 'to_apply':  # scalar reducers
        continue
      mult = (int(trip.group(1)) if trip else None) if kind == 'body' else 1
      comps[name][1].append((callee, mult))
  return comps, entry


def loop_flops(hlo: str) -> Tuple[float, float, int, int]:
  """(dot FLOPs counting each loop body once, dot FLOPs with trip counts,
  number of loops, loops with unknown trip count) of an HLO module's text."""
  comps, entry = _parse(hlo)
  loops = sum(1 for c in comps.values() for _, m in c[1] if m != 1)
  unknown = sum(1 for c in comps.values() for _, m in c[1] if m is None)

  def total(name, with_trips, seen=()):
    if name not in comps or name in seen:
      return 0.0
    own, callees = comps[name]
    return own + sum(((m or 1) if with_trips else 1) * total(c, with_trips, seen + (name,))
                     for c, m in callees)

  if entry is None:
    return 0.0, 0.0, loops, unknown
  return total(entry, False), total(entry, True), loops, unknown

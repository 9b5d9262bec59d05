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
from typing import Any, Dict, List, Optional, Sequence, Tuple


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
  fields = (
    'argument_size_in_bytes',
    'output_size_in_bytes',
    'temp_size_in_bytes',
    'alias_size_in_bytes',
    'generated_code_size_in_bytes',
  )
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
  return dict(
    flops_xla=xla, flops=xla + max(0.0, repeated - once), loops=loops, unknown_trip_counts=unknown
  )


# ----------------------------------------------------------------------------
# Dot FLOPs from HLO text, with loop trip counts.
# ----------------------------------------------------------------------------

_COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->.*\{\s*$')
_CALLEE = re.compile(
  r'\b(calls|body|to_apply|branch_computations|true_computation|'
  r'false_computation)=(?:\{([^}]*)\}|%?([\w.\-]+))'
)
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\]')
_PARAM = re.compile(r'%?([\w.\-]+):\s*\w+\[([\d,]*)\]')
_DOT = re.compile(r'\sdot\(\s*%?([\w.\-]+)[^,]*,.*lhs_contracting_dims=\{([\d,]*)\}')

Call = Tuple[str, str, Optional[int]]  # (kind, callee, times: None for a loop of unknown count)


def computations(hlo: str) -> Tuple[Dict[str, Tuple[str, List[str]]], Optional[str]]:
  """An HLO module's text split by computation: ({name: (its parameters' text, its body's
  lines)}, the entry computation's name or None)."""
  comps: Dict[str, Tuple[str, List[str]]] = {}
  entry, name = None, None
  for line in hlo.splitlines():
    m = _COMPUTATION.match(line)
    if m:
      name = m.group(1)
      entry = name if line.startswith('ENTRY') else entry
      comps[name] = (m.group(2), [])
    elif name is not None and line.strip() == '}':
      name = None
    elif name is not None:
      comps[name][1].append(line)
  return comps, entry


def calls(
  line: str,
  kinds: Sequence[str] = (
    'calls',
    'body',
    'branch_computations',
    'true_computation',
    'false_computation',
  ),
) -> List[Call]:
  """The computations one instruction calls, of the given kinds: (kind, callee, times),
  times being a `while` body's known trip count (None when unknown) and 1 otherwise.
  `to_apply` (scalar reducers) is left out unless asked for."""
  trip = _TRIP.search(line)
  out = []
  for kind, listed, one in _CALLEE.findall(line):  # kind={%a, %b} or kind=%a
    if kind not in kinds:
      continue
    times = (int(trip.group(1)) if trip else None) if kind == 'body' else 1
    out.extend((kind, c.strip().lstrip('%'), times) for c in (listed or one).split(','))
  return out


def call_counts(graph: Dict[str, List[Call]], entry: str, loops: bool = True) -> Dict[str, float]:
  """How often each computation runs per run of `entry`: summed over the call paths, the
  product of the loop trip counts along each (a loop of unknown count, or every loop when
  `loops` is False, counts once). A recursive path is cut where it repeats."""
  counts: Dict[str, float] = {}

  def visit(name, times, seen):
    if name not in graph or name in seen:
      return
    counts[name] = counts.get(name, 0.0) + times
    for _, callee, n in graph[name]:
      visit(callee, times * ((n or 1) if loops else 1), seen + (name,))

  visit(entry, 1.0, ())
  return counts


def _dims(text: str) -> Tuple[int, ...]:
  return tuple(int(d) for d in text.split(',') if d)


def _dot_flops(params: str, lines: List[str]) -> float:
  """The dot FLOPs of one computation's own instructions (callees not included)."""
  shapes = {p: _dims(d) for p, d in _PARAM.findall(params)}
  total = 0.0
  for line in lines:
    inst = _INSTRUCTION.match(line)
    if not inst:
      continue
    shapes[inst.group(1)] = _dims(inst.group(3))
    dot = _DOT.search(line)
    if dot and dot.group(1) in shapes:
      contract = math.prod(shapes[dot.group(1)][i] for i in _dims(dot.group(2)))
      total += 2.0 * math.prod(_dims(inst.group(3))) * contract
  return total


def loop_flops(hlo: str) -> Tuple[float, float, int, int]:
  """(dot FLOPs counting each loop body once, dot FLOPs with trip counts,
  number of loops, loops with unknown trip count) of an HLO module's text."""
  comps, entry = computations(hlo)
  graph = {
    name: [c for line in lines for c in calls(line, ('calls', 'body'))]
    for name, (_, lines) in comps.items()
  }
  bodies = [n for cs in graph.values() for kind, _, n in cs if kind == 'body']
  loops, unknown = len(bodies), sum(1 for n in bodies if n is None)
  if entry is None:
    return 0.0, 0.0, loops, unknown
  own = {name: _dot_flops(params, lines) for name, (params, lines) in comps.items()}
  total = lambda counts: sum(own[name] * times for name, times in counts.items())
  return (
    total(call_counts(graph, entry, loops=False)),
    total(call_counts(graph, entry)),
    loops,
    unknown,
  )

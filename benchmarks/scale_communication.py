"""benchmarks.scale's communication: the bytes each device sends per step, read from the
collectives of the compiled program."""

import math
import re
from typing import Dict

from benchmarks import xla_stats

_BYTES = {
  'pred': 1,
  's8': 1,
  'u8': 1,
  's16': 2,
  'u16': 2,
  'f16': 2,
  'bf16': 2,
  's32': 4,
  'u32': 4,
  'f32': 4,
  's64': 8,
  'u64': 8,
  'f64': 8,
  'c64': 8,
  'c128': 16,
}
_SHAPE = re.compile(r'\b([a-z]+\d*)\[([\d,]*)\]')
_COLLECTIVE = re.compile(
  r'=\s*(.*?)\s(all-reduce|all-gather|reduce-scatter|all-to-all|'
  r'collective-permute)(-start)?\('
)
_GROUPS = re.compile(r'replica_groups=(\{\{[\d,]*\}|\[(\d+),(\d+)\]<=)')
_PAIRS = re.compile(r'source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}')
KINDS = {'collective-permute': 'permute', 'all-reduce': 'all_reduce'}


def _shape_bytes(shape_text: str) -> int:
  return sum(
    _BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(',') if d)
    for dtype, dims in _SHAPE.findall(shape_text)
  )


def communication(hlo: str, devices: int) -> Dict[str, float]:
  """Bytes one device sends per step (the mean over devices) by kind, from the compiled
  HLO's collectives: 'permute' (collective-permutes: only the sequence-parallel forms
  send point to point), 'all_reduce' (the parameter gradients' sums over the devices
  holding copies, which XLA combines with any sum of the form), 'other', and 'total'."""
  comps, entry = xla_stats.computations(hlo)
  own: Dict[str, Dict[str, float]] = {name: {} for name in comps}
  for name, (_, lines) in comps.items():
    for line in lines:
      c = _COLLECTIVE.search(line)
      if not c:
        continue
      op, size = c.group(2), _shape_bytes(c.group(1))
      if c.group(3) and op == 'collective-permute':  # (operand, result, contexts)
        size = _shape_bytes(_SHAPE.search(c.group(1)).group(0))
      group = devices
      g = _GROUPS.search(line)
      if g:
        group = int(g.group(3)) if g.group(3) else len(g.group(1).strip('{}').split(','))
      if op == 'collective-permute':
        pairs = _PAIRS.search(line)
        senders = len(re.findall(r'\{\d+,\d+\}', pairs.group(1))) if pairs else devices
        sent = size * senders / devices
      elif op == 'all-reduce':
        sent = 2 * (group - 1) / group * size
      elif op == 'reduce-scatter':
        sent = (group - 1) * size
      else:  # all-gather (size: the gathered result), all-to-all
        sent = (group - 1) / group * size
      kind = KINDS.get(op, 'other')
      own[name][kind] = own[name].get(kind, 0.0) + (sent if group > 1 else 0.0)
  graph = {
    name: [c for line in lines for c in xla_stats.calls(line)] for name, (_, lines) in comps.items()
  }
  result = {kind: 0.0 for kind in ('permute', 'all_reduce', 'other')}
  for name, times in (xla_stats.call_counts(graph, entry) if entry else {}).items():
    for kind, value in own[name].items():
      result[kind] = result.get(kind, 0.0) + times * value
  result['total'] = sum(result.values())
  return result

r"""The longest sequence each device count trains at one per-device memory (context parallelism).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.scale \
        --out=docs/results --name=scale

For each mechanism (--mechanisms) and device count n (--devices), the trainer's own train
step (`train.api`) of LRA Text (configs/lra/text.py, --size: small is 2 layers, width 64,
4 heads, MLP 128; sinusoidal positions, mean pooling: no parameter grows with the length;
dropout off), batch 1, on the mesh {'data': 1, 'fsdp': 1, 'sequence': n}: every device
holds 1/n of the sequence and the attention runs in the mechanism's sequence-parallel
form (`Mechanism.sequence_parallel`: softmax 'ring', linear 'prefix_state',
gated_deltanet 'transition', local 'halo'). Reported per (mechanism, n):

  longest     the longest length, in steps of n x --block tokens, whose compiled step
              needs at most --budget_mib per device by XLA's memory analysis (arguments
              + outputs + temporaries - aliased: `benchmarks.xla_stats.memory`), found by
              compiling only (from the previous device count's blocks per device, or a
              linear extrapolation of 1 and 2 blocks; then stepping out and bisecting);
              `vs 1 device` divides it by the 1-device length;
  memory      that step's per-device memory, and the next length's (which does not fit);
  step time   the median wall time of --repeats steps at that length after a warm-up,
              from random parameters (emulated CPU devices share the host's cores: this
              is the work of all n devices done by those cores, not the speed of n real
              devices);
  sent        bytes each device sends per step (the mean over devices), read from the
              compiled program's collectives (their shapes, replica groups and source-
              target pairs, times the trip counts of the loops around them): 'permutes'
              the collective-permutes of the sequence-parallel form (the ring's
              key/value blocks and their gradients, the state scan, the halo),
              'all-reduces' the parameter gradients summed over the devices holding
              copies (ring: 2 (g - 1) / g of the bytes; XLA combines any sum of the form
              into them), 'other' what else XLA inserted (all-gathers, ...).

--tiny runs in seconds (the tests): --devices=1,2, a 1-layer width-16 model, 32-token
blocks, a 2 MiB budget, one timed step. Writes <out>/<name>.json and .md.
"""

import math
import re
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import numpy as np

from benchmarks import common
from benchmarks import output
from benchmarks import xla_stats

MECHANISMS = ('softmax', 'linear', 'gated_deltanet', 'local')
TINY = dict(devices='1,2', budget_mib=2.0, block=32, repeats=1, d_model=16, depth=1, max_blocks=64)


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_list(
    'mechanisms', list(MECHANISMS), 'mechanisms (with a sequence-parallel form)', flag_values=fv
  )
  flags.DEFINE_string(
    'devices',
    '1,2,4,8',
    'device counts (comma list); the largest must not exceed jax.device_count()',
    flag_values=fv,
  )
  flags.DEFINE_float(
    'budget_mib',
    48.0,
    'per-device memory budget (MiB, XLA memory analysis of the train step)',
    flag_values=fv,
  )
  flags.DEFINE_integer(
    'block', 256, 'length grid: multiples of devices x block tokens', flag_values=fv
  )
  flags.DEFINE_integer(
    'max_blocks', 4096, 'search no further than devices x block x this', flag_values=fv
  )
  flags.DEFINE_string('size', 'small', "configs/lra/text.py size", flag_values=fv)
  flags.DEFINE_integer('d_model', 0, 'width (0: the size\'s)', flag_values=fv)
  flags.DEFINE_integer('depth', 0, 'blocks (0: the size\'s)', flag_values=fv)
  flags.DEFINE_integer(
    'repeats', 3, 'timed steps at the longest length (0: none)', lower_bound=0, flag_values=fv
  )
  flags.DEFINE_bool(
    'tiny',
    False,
    'a seconds-long run (tests): ' + ', '.join(f'--{k}={v}' for k, v in TINY.items()),
    flag_values=fv,
  )
  common.define_output_flags(fv, out='benchmark_results', name='scale')


# ----------------------------------------------------------------------------
# The step of one (mechanism, devices, length).
# ----------------------------------------------------------------------------


def config_of(mechanism: str, length: int, devices: int, fv):
  from configs.lra import text  # pylint: disable=g-import-not-at-top

  config = text.get_config(f'mechanism={mechanism},max_length={length},size={fv.size}')
  config.model.update(dict(dropout_rate=0.0, attention_dropout_rate=0.0))
  if fv.d_model:
    config.model.update(dict(d_model=fv.d_model, mlp_dim=2 * fv.d_model))
  if fv.depth:
    config.model.depth = fv.depth
  config.dataset.update(dict(batch_size=1, eval_batch_size=1))
  config.train.mesh = dict(data=1, fsdp=1, sequence=devices)
  return config


def batch_of(length: int) -> Dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  return dict(
    inputs=rng.integers(1, 257, size=(1, length)).astype(np.int32),
    label=np.zeros((1,), np.int32),
    mask=np.ones((1,), np.float32),
  )


def build(mechanism: str, length: int, devices: int, fv):
  from train import api  # pylint: disable=g-import-not-at-top

  return api.build(
    config_of(mechanism, length, devices, fv),
    num_steps=1000,
    devices=jax.devices()[:devices],
    read_data=False,
    seed=0,
  )


def compiled_step(mechanism: str, length: int, devices: int, fv):
  """(compiled train step, its built run) at `length` on `devices` devices, lowered from
  shapes alone."""
  run = build(mechanism, length, devices, fv)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch_of(length).items()}
  return run.train_step.lower(run.abstract_state, batch).compile(), run


# ----------------------------------------------------------------------------
# Communication: the collectives of the compiled program.
# ----------------------------------------------------------------------------

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


def _bytes(shape_text: str) -> int:
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
      op, size = c.group(2), _bytes(c.group(1))
      if c.group(3) and op == 'collective-permute':  # (operand, result, contexts)
        size = _bytes(_SHAPE.search(c.group(1)).group(0))
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


# ----------------------------------------------------------------------------
# The search.
# ----------------------------------------------------------------------------


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
        compiled, run = compiled_step(self.mechanism, self.length(k), self.devices, self.fv)
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


def time_steps(compiled, run, length: int, repeats: int) -> Optional[float]:
  """Median seconds of `repeats` calls of the compiled step at `length` after a warm-up
  (None: no repeats), from random parameters (normal, 0.02) and a zero optimiser state."""
  if repeats <= 0:
    return None
  rng = np.random.default_rng(0)
  place = lambda a, x: jax.device_put(x.astype(a.dtype), a.sharding)
  abstract = run.abstract_state  # filled here: no compilation of the initialisation
  state = abstract.replace(
    step=place(abstract.step, np.zeros(())),
    params=jax.tree.map(lambda a: place(a, 0.02 * rng.standard_normal(a.shape)), abstract.params),
    opt_state=jax.tree.map(lambda a: place(a, np.zeros(a.shape)), abstract.opt_state),
  )
  batch = run.to_devices(batch_of(length))
  state, metrics = compiled(state, batch)  # warm-up
  jax.block_until_ready((state, metrics))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  if not np.isfinite(float(metrics['loss'])):
    raise FloatingPointError(f'loss {float(metrics["loss"])} at {length} tokens')
  return statistics.median(times)


def measure(mechanism: str, devices: Sequence[int], fv, log) -> List[Dict[str, Any]]:
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
    comm = communication(compiled.as_text(), n)
    seconds = time_steps(compiled, run, length, fv.repeats)
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


def _mib(x: Optional[float]) -> str:
  return output.MISSING if x is None else f'{x / 2**20:.1f} MiB'


def _comm(x: float) -> str:
  return '0' if not x else f'{x / 2**20:.2f} MiB' if x >= 2**20 else f'{x / 2**10:.1f} KiB'


def table(rows: Sequence[Dict[str, Any]]) -> str:
  body = []
  for r in rows:
    if 'error' in r:
      body.append([r['mechanism'], r['devices'], r['error']] + [''] * 7)
      continue
    c = r['comm_bytes']
    nxt = (
      _mib(r['next_memory_bytes'])
      if r['next_memory_bytes'] is not None
      else r['next_error'] or 'past the search'
    )
    body.append(
      [
        r['mechanism'],
        r['devices'],
        f"{r['length']:,}",
        f"{r['vs_one']:.2f}x" if r['vs_one'] else output.MISSING,
        _mib(r['memory_bytes']),
        f"{r['next_length']:,}: {nxt}",
        f"{r['step_s']:.3g} s" if r['step_s'] else output.MISSING,
        _comm(c['permute']),
        _comm(c['all_reduce']),
        _comm(c['other']),
      ]
    )
  return output.table(
    [
      'mechanism',
      'devices',
      'longest length',
      'vs 1 device',
      'memory / device',
      'next length: memory',
      'step time',
      'sent: permutes',
      'sent: all-reduces',
      'sent: other',
    ],
    body,
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  fv = common.parse_flags(define_flags, argv, __doc__)
  if fv.tiny:
    for key, value in TINY.items():
      if not fv[key].present:
        fv[key].value = value
  with common.flag_errors():
    devices = common.csv_list(fv.devices, int, 'devices')
    if not devices or min(devices) < 1 or max(devices) > jax.device_count():
      raise ValueError(
        f'--devices={fv.devices} is not valid with {jax.device_count()} '
        f'device(s); valid: counts from 1 to {jax.device_count()} (on CPU, '
        f'more with XLA_FLAGS=--xla_force_host_platform_device_count=8)'
      )
    from efficient_attn import registry  # pylint: disable=g-import-not-at-top

    valid = registry.names_where(lambda m: bool(m.sequence_parallel))
    bad = [m for m in fv.mechanisms if m not in valid]
    if bad:
      raise ValueError(
        f'--mechanisms: {bad[0]!r} has no sequence-parallel form; valid: {", ".join(valid)}'
      )
    if fv.budget_mib <= 0 or fv.block < 1 or fv.max_blocks < 1:
      raise ValueError(
        f'--budget_mib={fv.budget_mib}, --block={fv.block}, --max_blocks='
        f'{fv.max_blocks}: each must be > 0'
      )
  log = (lambda s: None) if fv.quiet else (lambda s: print(s, flush=True))
  start = time.time()
  rows = [r for m in fv.mechanisms for r in measure(m, sorted(devices), fv, log)]
  argv = sys.argv[1:] if argv is None else list(argv)
  flags = {f: fv[f].value for f in fv}
  model = (
    f"LRA Text (configs/lra/text.py, size={fv.size}"
    + (f', d_model={fv.d_model}' if fv.d_model else '')
    + (f', depth={fv.depth}' if fv.depth else '')
    + '), dropout off, batch 1'
  )
  notes = [
    f"{model}; the trainer's train step (AdamW) on the mesh {{'data': 1, 'fsdp': 1, "
    f"'sequence': n}} of the first n devices. Longest length: the longest multiple of "
    f"n x {fv.block} tokens (up to n x {fv.block} x {fv.max_blocks}) whose compiled step "
    f"needs at most {fv.budget_mib:g} MiB per device by XLA's memory analysis; vs 1 "
    f"device: that length / the 1-device length (n would be perfect scaling).",
    'Step time: median of the timed steps after a warm-up; the emulated devices share the '
    "host's cores, so it is the work of all n devices, not n devices' speed.",
    'Sent: bytes each device sends per step (mean over devices), from the compiled '
    "program's collectives and the trip counts of the loops around them: permutes "
    '(collective-permutes, the sequence-parallel forms: the ring\'s key/value blocks and '
    'their gradients, the state scan, the halo), all-reduces (the parameter gradients '
    'summed over the devices holding copies, 2 (g - 1) / g of the bytes, with any sum of '
    'the form XLA combined into them), other (what else XLA inserted).',
    f'{time.time() - start:.0f} s in all.',
    'command: '
    + (
      f'XLA_FLAGS=--xla_force_host_platform_device_count={max(devices)} '
      if max(devices) > 1
      else ''
    )
    + 'python -m benchmarks.scale '
    + ' '.join(argv),
  ]
  data = dict(
    device=common.device_info(), flags=flags, budget_bytes=fv.budget_mib * 2**20, rows=rows
  )
  output.finish_table(
    fv.out,
    fv.name,
    'The longest sequence trained per device count (context parallelism)',
    common.describe_device(data['device']),
    notes,
    table(rows),
    data,
    quiet=fv.quiet,
  )
  return data


if __name__ == '__main__':
  main()

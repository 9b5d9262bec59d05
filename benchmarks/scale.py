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

import sys
import time
from typing import Any, Dict, Optional, Sequence

import jax

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import scale_search

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
  rows = [
    r for m in fv.mechanisms for r in scale_search.measure_mechanism(m, sorted(devices), fv, log)
  ]
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
    device=machine.device_info(), flags=flags, budget_bytes=fv.budget_mib * 2**20, rows=rows
  )
  output.finish_table(
    fv.out,
    fv.name,
    'The longest sequence trained per device count (context parallelism)',
    machine.describe_device(data['device']),
    notes,
    table(rows),
    data,
    quiet=fv.quiet,
  )
  return data


if __name__ == '__main__':
  main()

r"""The longest sequence each mechanism trains on TPU v5e, by the TPU compiler's estimate.

    pip install libtpu   # or its site-packages folder on PYTHONPATH
    python -m benchmarks.tpu_memory --out=docs/results --name=tpu_memory

No TPU is needed, nor used: the trainer's own train step (`train.api`: the byte-level
causal LM of configs/bytelm.py, AdamW, dropout off, batch 1) is compiled ahead of time
for the chips of a TPU topology (--topology, 'v5e:2x4': 8 chips of 16 GiB) by the
compiler in the `libtpu` wheel (`jax.experimental.topologies.get_topology_desc`), and
its per-chip memory read from `compiled.memory_analysis()` (arguments + outputs +
temporaries - aliased: `benchmarks.xla_stats.memory`). These are the compiler's
estimates, not measurements on a chip: the runtime adds its own buffers, and a program
the compiler accepts may still fail to run.

For each mechanism (--mechanisms, 'name' or 'name:implementation', e.g.
'gated_deltanet:pallas') and chip count n (--chips), on the mesh {'data': 1, 'fsdp': 1,
'sequence': n} (n > 1: the mechanism's sequence-parallel form, softmax's ring), the
lengths --start x 2^k (on n chips from the 1-chip result) are compiled until one needs
more than --chip_gib per chip or does not compile (the compiler's first line is kept:
e.g. a Pallas kernel's VMEM). 'longest' is the last that fits, 'next' what the next
length needed or why it failed; 'kernel' says whether the step holds a Mosaic kernel
(a `tpu_custom_call`: softmax's splash, the gated family's Pallas kernels).

FSDP: for a model of about --fsdp_params parameters (the same LM, --fsdp_d_model wide,
depth chosen to reach it), the bytes per chip of the parameters and AdamW's state on
all the topology's chips as data (replicated) and as fsdp (`train.mesh`'s FSDP rule),
from the state's shardings (exact arithmetic, no compile).

The gated family's kernels choose their platform when lowered (`lax.platform_dependent`),
but a few choices are still made by `jax.default_backend()` at trace time (softmax's
splash kernel, chunk sizes, what 'auto' resolves to); this tool answers 'tpu' there while
it builds and lowers, so that the TPU's code paths are the ones compiled. libtpu reads
XLA_FLAGS too and aborts on a flag it does not know (the CPU compiler's, such as the
tests'): run it without them. --tiny runs in seconds (the tests). Writes
<out>/<name>.json and .md.
"""

import contextlib
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence
from unittest import mock

import jax

from benchmarks import common
from benchmarks import output
from benchmarks import xla_stats

MECHANISMS = ('softmax', 'linear', 'gated_deltanet:pallas', 'gated_deltanet:xla', 'local')
TINY = dict(
  mechanisms=['linear'],
  chips='1,2',
  d_model=32,
  num_heads=2,
  depth=1,
  start=64,
  max_length=128,
  fsdp_params=1e6,
  fsdp_d_model=128,
)


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_list(
    'mechanisms', list(MECHANISMS), "'name' or 'name:implementation'", flag_values=fv
  )
  flags.DEFINE_string('topology', 'v5e:2x4', 'TPU topology compiled for', flag_values=fv)
  flags.DEFINE_string('chips', '1,8', 'chip counts: the sequence split over n', flag_values=fv)
  flags.DEFINE_float('chip_gib', 16.0, 'memory per chip (GiB; v5e: 16)', flag_values=fv)
  flags.DEFINE_integer('d_model', 1024, 'width of the LM', flag_values=fv)
  flags.DEFINE_integer('num_heads', 8, 'heads (head dim: d_model / heads)', flag_values=fv)
  flags.DEFINE_integer('depth', 12, 'blocks of the LM', flag_values=fv)
  flags.DEFINE_integer('start', 1024, 'the first length tried on one chip', flag_values=fv)
  flags.DEFINE_integer('max_length', 2**20, 'no length past this is tried', flag_values=fv)
  flags.DEFINE_float('fsdp_params', 1e9, 'parameters of the FSDP model', flag_values=fv)
  flags.DEFINE_integer('fsdp_d_model', 2048, 'width of the FSDP model', flag_values=fv)
  flags.DEFINE_bool(
    'tiny',
    False,
    'a seconds-long run (tests): '
    + ', '.join(f"--{k}={','.join(v) if isinstance(v, list) else v}" for k, v in TINY.items()),
    flag_values=fv,
  )
  common.define_output_flags(fv, out='benchmark_results', name='tpu_memory')


def topology_devices(name: str) -> List[Any]:
  """The chips of TPU topology `name`, for compiling only (ValueError without libtpu)."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  if importlib.util.find_spec('libtpu') is None:
    raise ValueError(
      f'--topology={name!r} needs the TPU compiler, and libtpu is not installed; '
      f'pip install libtpu, or put its site-packages folder on PYTHONPATH'
    )
  # Which TPU this host is, for libtpu's start-up: without it, libtpu asks the cloud's
  # metadata server. Any v5e name will do; the topology compiled for is `name`. Compiling
  # touches no chip, so several processes may load libtpu at once (its lock file would
  # refuse the second).
  os.environ.setdefault('TPU_ACCELERATOR_TYPE', 'v5litepod-4')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  try:
    return list(topologies.get_topology_desc(name, 'tpu').devices)
  except Exception as e:  # pylint: disable=broad-except  (an unknown name, a libtpu error)
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise ValueError(f'--topology={name!r}: the TPU compiler refused it: {first[:200]}') from None


@contextlib.contextmanager
def tracing_for_tpu():
  """`jax.default_backend()` answers 'tpu' while the step is built and lowered."""
  with mock.patch.object(jax, 'default_backend', lambda: 'tpu'):
    yield


def lm_config(spec: str, length: int, chips: int, fv, d_model=None, depth=None):
  """configs/bytelm.py's causal byte LM for `spec` ('name[:implementation]') at `length`,
  batch 1, dropout off, on the mesh {'data': 1, 'fsdp': 1, 'sequence': chips}; a `d_model`
  other than --d_model keeps its head dim (--d_model / --num_heads)."""
  from configs import bytelm  # pylint: disable=g-import-not-at-top

  name, _, implementation = spec.partition(':')
  d_model, depth = d_model or fv.d_model, depth or fv.depth
  heads = max(1, d_model // (fv.d_model // fv.num_heads))
  config = bytelm.get_config(
    f'{name},d_model={d_model},num_heads={heads},depth={depth},seq_len={length},batch_size=1'
  )
  if implementation:
    config.attention.options.implementation = implementation
  config.model.update(dict(dropout_rate=0.0, attention_dropout_rate=0.0))
  config.dataset.eval_batch_size = 1
  config.train.mesh = dict(data=1, fsdp=1, sequence=chips)
  return config


def build(config, devices):
  from train import api  # pylint: disable=g-import-not-at-top

  with tracing_for_tpu():
    return api.build(config, 1000, devices=devices, read_data=False, seed=0)


def compile_step(spec: str, length: int, chips: int, devices, fv) -> Dict[str, Any]:
  """{'bytes': per-chip total, 'kernel': a Mosaic call in the step} or {'error': line}."""
  from benchmarks import train_speed  # pylint: disable=g-import-not-at-top

  try:
    config = lm_config(spec, length, chips, fv)
    run = build(config, devices[:chips])
    batch = train_speed.synthetic_batch(config, 1)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    with tracing_for_tpu():
      lowered = run.train_step.lower(run.abstract_state, batch)
    kernel = 'tpu_custom_call' in lowered.as_text()
    memory = xla_stats.memory(lowered.compile())
  except Exception as e:  # pylint: disable=broad-except  (a refusal or the compiler's)
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return dict(error=f'{type(e).__name__}: {" ".join(lines[:2])}'[:240])  # what and why
  return dict(bytes=memory['total'] if memory else None, kernel=kernel, memory=memory)


def longest(spec: str, chips: int, first: int, devices, fv, log) -> Dict[str, Any]:
  """The longest of first x 2^k (up to --max_length) that compiles within --chip_gib."""
  budget = fv.chip_gib * 2**30
  best, tried, length = None, [], first
  while length <= fv.max_length:
    result = dict(length=length, **compile_step(spec, length, chips, devices, fv))
    tried.append(result)
    fits = 'error' not in result and result['bytes'] is not None and result['bytes'] <= budget
    log(
      f'[tpu_memory] {spec} on {chips} chip(s), {length:,} tokens: '
      + (result.get('error') or _gib(result['bytes']))
    )
    if not fits:
      break
    best, length = result, 2 * length
  after = tried[-1] if tried[-1] is not best else None
  return dict(mechanism=spec, chips=chips, longest=best, next=after, tried=tried)


def state_bytes_per_chip(config, devices) -> Dict[str, int]:
  """{'params': ..., 'state': params + AdamW state}: bytes per chip (a leaf's shard)."""
  run = build(config, devices)
  per_chip: Dict[str, int] = {}
  for part, tree in (('params', run.abstract_state.params), ('state', run.abstract_state)):
    total = 0
    for leaf in jax.tree.leaves(tree):
      shard = leaf.sharding.shard_shape(leaf.shape)
      total += math.prod(shard) * leaf.dtype.itemsize
    per_chip[part] = total
  return per_chip


def fsdp_savings(devices, fv) -> Dict[str, Any]:
  """Parameters and optimiser state per chip of a ~--fsdp_params model on all `devices`,
  replicated (data) and split (fsdp)."""
  d = fv.fsdp_d_model
  per_block = 12 * d * d  # attention 4 d^2 + MLP 8 d^2 (mlp_dim 4 d)
  depth = max(1, round(fv.fsdp_params / per_block))
  n = len(devices)
  rows = {}
  for axis in ('data', 'fsdp'):
    config = lm_config('softmax', 256, 1, fv, d_model=d, depth=depth)
    config.train.mesh = {'data': 1, 'fsdp': 1, 'sequence': 1, axis: n}
    config.dataset.batch_size = n  # a row per chip (the state does not depend on it)
    rows[axis] = state_bytes_per_chip(config, devices)
  config = lm_config('softmax', 256, 1, fv, d_model=d, depth=depth)
  leaves = jax.tree.leaves(build(config, devices[:1]).abstract_state.params)
  params = sum(math.prod(x.shape) for x in leaves)
  return dict(d_model=d, depth=depth, params=params, chips=n, **rows)


def _gib(n: Optional[float]) -> str:
  return output.fmt_bytes(n) or output.MISSING


def table(rows: Sequence[Dict[str, Any]]) -> str:
  body = []
  for r in rows:
    best, nxt = r['longest'], r['next']
    if nxt is None:
      after = 'past --max_length'
    elif 'error' in nxt:
      after = f"{nxt['length']:,}: {nxt['error']}"
    else:
      after = f"{nxt['length']:,}: {_gib(nxt['bytes'])}"
    body.append(
      [
        r['mechanism'],
        r['chips'],
        f"{best['length']:,}" if best else 'none',
        _gib(best['bytes']) if best else output.MISSING,
        ('yes' if best['kernel'] else 'no') if best else output.MISSING,
        after,
      ]
    )
  return output.table(
    ['mechanism', 'chips', 'longest length', 'memory / chip', 'kernel', 'next length'],
    body,
    align='llrrll',
  )


def fsdp_table(f: Dict[str, Any]) -> str:
  rows = [
    [
      f"{axis} {f['chips']}",
      _gib(f[axis]['params']),
      _gib(f[axis]['state']),
    ]
    for axis in ('data', 'fsdp')
  ]
  saved = 1 - f['fsdp']['state'] / f['data']['state']
  rows.append(['saved by fsdp', '', f'{100 * saved:.1f}%'])
  return output.table(['mesh', 'parameters / chip', 'parameters + AdamW / chip'], rows)


def markdown(data: Dict[str, Any]) -> str:
  """The report of a run's JSON: title, what it was compiled for, notes, the tables."""
  head = output.header(
    'The longest training sequence per mechanism on TPU v5e (compiler estimates)',
    f"{data['topology']}, ahead of time by libtpu on a CPU host (no TPU ran)",
    data['notes'],
    label='Compiled for',
  )
  return '\n'.join([head, table(data['rows']), '', fsdp_table(data['fsdp']), ''])


def reduced(fv) -> str:
  """A note naming the flags of the table's scope set away from their defaults."""
  scope = ('mechanisms', 'chips', 'd_model', 'num_heads', 'depth', 'start', 'max_length')
  value = lambda v: ','.join(map(str, v)) if isinstance(v, list) else v
  changed = [f'--{f}={value(fv[f].value)}' for f in scope if fv[f].value != fv[f].default]
  if not changed:
    return 'The full table: every flag of its scope at its default.'
  return (
    f"**A reduced run**: {', '.join(changed)} (the defaults' table is the command without them)."
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  fv = common.parse_flags(define_flags, argv, __doc__)
  if fv.tiny:
    for key, value in TINY.items():
      if not fv[key].present:
        fv[key].value = value
  with common.flag_errors():
    chips = sorted(common.csv_list(fv.chips, int, 'chips'))
    devices = topology_devices(fv.topology)
    if not chips or chips[0] < 1 or chips[-1] > len(devices):
      raise ValueError(
        f'--chips={fv.chips} is not valid on {fv.topology} ({len(devices)} chips); '
        f'valid: counts from 1 to {len(devices)}'
      )
    if fv.start < 1 or fv.max_length < fv.start or fv.chip_gib <= 0:
      raise ValueError(
        f'--start={fv.start}, --max_length={fv.max_length}, --chip_gib={fv.chip_gib}: '
        f'valid: 1 <= start <= max_length, chip_gib > 0'
      )
  log = (lambda s: None) if fv.quiet else (lambda s: common.emit(s))
  begin = time.time()
  fsdp = fsdp_savings(devices, fv)
  rows = []
  for spec in fv.mechanisms:
    first = fv.start
    for n in chips:
      row = longest(spec, n, first, devices, fv, log)
      rows.append(row)
      if row['longest']:  # n chips hold at least what fewer held
        first = row['longest']['length']
  argv = sys.argv[1:] if argv is None else list(argv)
  notes = [
    '**Compiler estimates, not measurements**: no TPU ran this. The train step was '
    f"compiled ahead of time for {fv.topology} by libtpu's compiler on a CPU host, and "
    'memory is `compiled.memory_analysis()` per chip (arguments + outputs + temporaries '
    '- aliased); the runtime adds its own buffers, and a program that compiles may '
    'still fail to run.',
    f"Model: configs/bytelm.py's causal byte LM, d_model {fv.d_model}, {fv.num_heads} "
    f'heads (head dim {fv.d_model // fv.num_heads}), depth {fv.depth}, MLP 4 x d_model, '
    'float32 parameters, AdamW, dropout off, batch 1, no rematerialisation; each '
    "mechanism at its declared defaults ('name:implementation' sets that option). "
    "Mesh {'data': 1, 'fsdp': 1, 'sequence': n}: on n > 1 chips the sequence is split "
    "and the attention runs in the mechanism's sequence-parallel form (softmax: ring).",
    f'Longest length: the longest of {fv.start:,} x 2^k (on more chips, from the '
    f'1-chip result; up to {fv.max_length:,}) whose step compiles and needs at most '
    f'{fv.chip_gib:g} GiB per chip; next length: what the next one needed, or the '
    "compiler's (or the library's) first line. Kernel: the step holds a Mosaic kernel "
    '(tpu_custom_call).',
    "`jax.default_backend()` answered 'tpu' while the step was traced: the library still "
    "makes a few choices by it (softmax's splash kernel, chunk sizes, 'auto').",
    f'FSDP: a model of {fsdp["params"]:,} parameters of the same family (d_model '
    f'{fsdp["d_model"]}, depth {fsdp["depth"]}) on {fsdp["chips"]} chips: bytes per chip '
    "of the float32 parameters, and with AdamW's two moments, from the state's shardings "
    '(exact, not compiled).',
    f'{time.time() - begin:.0f} s in all.',
    reduced(fv),
    'command (libtpu installed, or its site-packages folder on PYTHONPATH): '
    + output.command('benchmarks.tpu_memory', argv),
  ]
  data = dict(
    topology=fv.topology,
    flags={f: fv[f].value for f in fv},
    budget_bytes=fv.chip_gib * 2**30,
    notes=notes,
    rows=rows,
    fsdp=fsdp,
  )
  output.finish(fv.out, fv.name, data, markdown(data), quiet=fv.quiet)
  return data


if __name__ == '__main__':
  main()

r"""Speed and memory of attention mechanisms against sequence length.

For each target (exact `jax.nn.dot_product_attention`, every registered
mechanism, and whole layers 'mechanism/projection'), each mode (forward;
forward+backward = gradient of sum(outputs) w.r.t. q, k, v and parameters) and
each length: compile, warm up once, time the median of up to --repeats calls
(each followed by block_until_ready), and record the peak memory:

  * 'xla' (default): XLA's compiled memory analysis, arguments + outputs +
    temporaries - aliased bytes: what the program itself needs;
  * with --isolate, every point runs in a fresh subprocess and also records the
    process's peak resident memory (CPU, `ru_maxrss`, includes the runtime's
    ~0.3-0.5 GiB) or the device's `peak_bytes_in_use` (GPU/TPU); the headline
    memory is then that number. A point that kills its subprocess (OOM) is
    recorded as failed instead of ending the run.

Points whose XLA memory exceeds --memory_budget_gb, or whose time per call
extrapolated from the shorter lengths exceeds --max_time_s, are recorded as
skipped with the reason; longer lengths of that target are then skipped too.

What runs: --mechanisms names mechanisms ('exact' among them), as the other
benchmarks name them; --targets names the same and also layers
'mechanism/projection'; give one of them (both only with the same list). Layers
of --layers are added to either; without --targets and --mechanisms, the
targets are exact, every registered mechanism and --layers' default layers;
with one of them, only what it and an explicit --layers name.

Sizes (--lengths, --extra_lengths, --batch, --heads, --head_dim) must be
positive and --dtype one of DTYPES: bad input stops in one line before anything
is compiled or written. A run in which every point failed writes its outputs
(the reasons are in the table) and exits non-zero.

    python -m benchmarks.speed --out=benchmark_results/speed
    python -m benchmarks.speed --mechanisms=exact,softmax_chunked,linear \
        --lengths=1024,4096 --modes=fwd_bwd --extra_lengths=softmax_chunked=32768

Writes <out>/<name>.json, <out>/<name>.md, <out>/<name>_time.png,
<out>/<name>_memory.png and, when 'exact' was measured, <out>/<name>_speedup.png
(time of exact / time of each target; without exact there is no speedup plot,
the table says so, and an older <name>_speedup.png is removed).
"""

import json
import os
import time
from typing import Any, Dict, Optional, Sequence

from absl import flags
import jax

from benchmarks import attention_bench
from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import speed_measure
from benchmarks import speed_output
from benchmarks import speed_summary
from benchmarks import speed_targets
import efficient_attn as ea

MODES = ('fwd', 'fwd_bwd')
CPU_LENGTHS = tuple(2**i for i in range(8, 15))  # 256 .. 16384
ACCEL_LENGTHS = tuple(2**i for i in range(8, 18))  # 256 .. 131072
DEFAULT_LAYERS = ('linear/standard', 'linear/optimised', 'linear/efficient', 'linear/super')
DTYPES = ('float32', 'bfloat16', 'float16', 'float64')  # float64 needs JAX_ENABLE_X64=1


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/speed', name='speed')
  flags.DEFINE_string(
    'targets',
    None,
    "comma list: 'exact', mechanisms, 'mechanism/projection' layers, each "
    "optionally with its own options 'mechanism@option=value[@...]', e.g. "
    "gla@form=naive (default: exact and every registered mechanism, and "
    "--layers' default layers)",
    flag_values=fv,
  )
  flags.DEFINE_string(
    'mechanisms',
    None,
    "comma list: 'exact' and mechanisms, as --targets but no layers "
    "(those go in --layers); give --mechanisms or --targets, not both",
    flag_values=fv,
  )
  flags.DEFINE_string(
    'layers',
    ','.join(DEFAULT_LAYERS),
    "layers 'mechanism/projection' measured besides the mechanisms; the "
    "default ones only when neither --targets nor --mechanisms is given "
    "('' for none)",
    flag_values=fv,
  )
  flags.DEFINE_string(
    'lengths',
    None,
    'comma list (default 256..16384 doubling on CPU, ..131072 on GPU/TPU)',
    flag_values=fv,
  )
  flags.DEFINE_enum(
    'order',
    'target',
    ['target', 'length'],
    'target: each target through every length in turn; length: at each length '
    'every target in turn (interleaved, so a change in machine load falls on '
    'all targets alike)',
    flag_values=fv,
  )
  flags.DEFINE_multi_string(
    'compare',
    [],
    'a:b: also report time(a) / time(b) at each length, e.g. gla@form=naive:gla (repeatable)',
    flag_values=fv,
  )
  flags.DEFINE_multi_string(
    'extra_lengths',
    [],
    'target=len[,len]: more lengths for one target, e.g. softmax_chunked=32768 (repeatable)',
    flag_values=fv,
  )
  flags.DEFINE_string('modes', ','.join(MODES), 'fwd, fwd_bwd', flag_values=fv)
  flags.DEFINE_integer('batch', 1, 'batch size', lower_bound=1, flag_values=fv)
  flags.DEFINE_integer('heads', 8, 'attention heads', lower_bound=1, flag_values=fv)
  flags.DEFINE_integer('head_dim', 64, 'dimension per head', lower_bound=1, flag_values=fv)
  flags.DEFINE_enum(
    'dtype', 'float32', DTYPES, 'dtype of q, k, v (float64 needs JAX_ENABLE_X64=1)', flag_values=fv
  )
  flags.DEFINE_bool('causal', False, 'causal attention', flag_values=fv)
  flags.DEFINE_multi_string(
    'option',
    [],
    'mechanism.option=value, e.g. nystrom.num_landmarks=32 (repeatable)',
    flag_values=fv,
  )
  flags.DEFINE_integer('repeats', 5, 'timed calls per point', lower_bound=1, flag_values=fv)
  flags.DEFINE_enum(
    'statistic',
    'median',
    ['median', 'min'],
    'which of the timed calls is reported (min resists a busy machine)',
    flag_values=fv,
  )
  flags.DEFINE_float(
    'time_budget_s',
    30.0,
    'per point: stop repeating once timed calls pass half of it; a warm-up '
    'longer than it is itself the (single) measurement',
    flag_values=fv,
  )
  flags.DEFINE_float(
    'max_time_s',
    120.0,
    'skip a point whose time per call, extrapolated from shorter lengths, exceeds this',
    flag_values=fv,
  )
  flags.DEFINE_float(
    'memory_budget_gb',
    None,
    "per point, by XLA's memory analysis (default 85% of RAM/device)",
    flag_values=fv,
  )
  flags.DEFINE_bool(
    'isolate',
    False,
    'one subprocess per point; records peak RSS / device peak memory',
    flag_values=fv,
  )
  flags.DEFINE_float('point_timeout_s', 1800.0, 'seconds per --isolate subprocess', flag_values=fv)
  flags.DEFINE_string(
    'fit_range', '1024,16384', 'lo,hi lengths for the fitted scaling exponent', flag_values=fv
  )
  flags.DEFINE_string(
    'exact_implementation',
    None,
    "jax.nn.dot_product_attention implementation (default: jax's choice, 'xla' on CPU)",
    flag_values=fv,
  )
  flags.DEFINE_integer('seed', 0, 'random seed', flag_values=fv)
  flags.DEFINE_string(
    'point_spec',
    None,
    'internal: one point as JSON, measured by an --isolate subprocess',
    flag_values=fv,
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = common.parse_flags(define_flags, argv, __doc__)
  if args.point_spec is not None:  # a subprocess of --isolate
    spec = json.loads(args.point_spec)
    print(json.dumps(output.jsonable(speed_measure.safe_measure(spec))))
    return {}
  info = machine.device_info()
  platform = info['platform']
  with common.flag_errors():
    targets = speed_targets.select_targets(args)
    compare = []
    for item in args.compare:
      a, sep, b = item.partition(':')
      if not sep or a not in targets or b not in targets:
        raise ValueError(
          f'--compare={item!r} is not valid; it must be a:b, two of the '
          f'targets ({", ".join(targets)})'
        )
      compare.append((a, b))
    lengths = (
      speed_targets.positive_lengths(args.lengths, '--lengths')
      if args.lengths
      else list(CPU_LENGTHS if platform == 'cpu' else ACCEL_LENGTHS)
    )
    for item in args.extra_lengths:
      target, _, values = item.partition('=')
      if target not in targets:
        raise ValueError(
          f'--extra_lengths={item!r}: {target!r} is not one of the targets ({", ".join(targets)})'
        )
      speed_targets.positive_lengths(values, f'--extra_lengths of {target}')
    if args.dtype == 'float64' and not jax.config.jax_enable_x64:
      raise ValueError(
        "--dtype='float64' is not valid without JAX_ENABLE_X64=1 (the arrays "
        f"would be float32); valid: {', '.join(DTYPES[:-1])}"
      )
    modes = common.csv_list(args.modes)
    bad = sorted(set(modes) - set(MODES))
    if bad:
      raise ValueError(f'--modes: unknown mode(s) {bad}; valid: {", ".join(MODES)}')
    overrides = common.parse_options(args.option)
    mechanisms = sorted(
      {attention_bench.parse_target(speed_targets.split_target(t)[0])[0] for t in targets}
    )
    options = {m: attention_bench.effective_options(m, overrides.get(m)) for m in mechanisms}
    fit_range = common.csv_list(args.fit_range, int, '--fit_range')
    if len(fit_range) != 2:
      raise ValueError(f'--fit_range={args.fit_range!r} is not valid; valid: two lengths lo,hi')
    fit_lo, fit_hi = fit_range
  memory_budget = (
    int(args.memory_budget_gb * 2**30)
    if args.memory_budget_gb
    else int(0.85 * (machine.total_memory_bytes() or 0)) or None
  )
  if args.isolate:
    source = 'rss' if platform == 'cpu' else 'device'
    description = (
      "peak resident memory of a fresh process per point (`ru_maxrss`, includes "
      'the JAX runtime and inputs)'
      if source == 'rss'
      else "device `peak_bytes_in_use` of a fresh process per point"
    )
  else:
    source = 'xla'
    description = (
      "XLA compiled memory analysis: arguments + outputs + temporaries - "
      'aliased bytes of the jitted program (excludes runtime overhead)'
    )
  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
    batch=args.batch,
    heads=args.heads,
    head_dim=args.head_dim,
    dtype=args.dtype,
    causal=args.causal,
    modes=modes,
    lengths=lengths,
    extra_lengths=args.extra_lengths,
    repeats=args.repeats,
    statistic=args.statistic,
    time_budget_s=args.time_budget_s,
    max_time_s=args.max_time_s,
    memory_budget_bytes=memory_budget,
    memory_source=source,
    memory_description=description,
    options=options,
    fit_range=[fit_lo, fit_hi],
    exact_implementation=args.exact_implementation or 'default (XLA on CPU)',
    isolate=args.isolate,
    order=args.order,
    compare=compare,
    targets=targets,
    causal_only_targets=[
      t
      for t in targets
      if attention_bench.parse_target(speed_targets.split_target(t)[0])[0] != attention_bench.EXACT
      and ea.get_mechanism(
        attention_bench.parse_target(speed_targets.split_target(t)[0])[0]
      ).causal_only
    ],
    command=output.command('benchmarks.speed', argv),
  )
  start = time.time()
  points = speed_measure.measure_points(
    args, targets, lengths, modes, options, memory_budget, platform
  )
  meta['wall_time_s'] = time.time() - start
  summary = speed_summary.summarise(points, targets, modes, fit_lo, fit_hi)
  ratios = speed_summary.compare_ratios(points, compare, modes)
  pngs = speed_output.write_plots(args.out, args.name, meta, points, summary, targets, modes)
  data = dict(meta=meta, targets=targets, points=points, summary=summary, ratios=ratios, plots=pngs)
  output.finish(
    args.out,
    args.name,
    data,
    speed_output.markdown(meta, points, summary, targets, modes, ratios),
    quiet=args.quiet,
  )
  if (
    points
    and not any(p['status'] == 'ok' for p in points)
    and any(p['status'] == 'failed' for p in points)
  ):
    failed = sum(p['status'] == 'failed' for p in points)
    rest = '' if failed == len(points) else ', the rest skipped'
    raise SystemExit(
      f'Error: no point was measured ({failed} of {len(points)} failed{rest}); '
      f"the reasons are in {os.path.join(args.out, args.name + '.md')}"
    )
  return data


if __name__ == '__main__':
  main()

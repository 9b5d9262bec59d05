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
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import flags
import jax
import jax.numpy as jnp

from benchmarks import common
from benchmarks import output
from benchmarks import xla_stats
import efficient_attn as ea

MODES = ('fwd', 'fwd_bwd')
MODE_TITLES = {'fwd': 'forward', 'fwd_bwd': 'forward + backward'}
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


# ----------------------------------------------------------------------------
# One point.
# ----------------------------------------------------------------------------


def split_target(target: str) -> Tuple[str, Dict[str, Any]]:
  """'gla@form=naive@chunk_size=32' -> ('gla', {'form': 'naive', 'chunk_size': 32}).

  Raises ValueError for an unknown mechanism or projection, or an option the
  mechanism does not have or refuses.
  """
  base, *items = target.split('@')
  mechanism, _ = common.parse_target(base)
  if items and mechanism == common.EXACT:
    raise ValueError(f"'{common.EXACT}' takes no options: {target!r}")
  overrides = {}
  for item in items:
    option, sep, value = item.partition('=')
    if not sep:
      raise ValueError(f'{target!r}: {item!r} must look like option=value')
    overrides[option] = common.parse_value(value)
  common.effective_options(mechanism, overrides)  # ValueError for a bad option or value
  return base, overrides


def build(spec: Dict[str, Any]) -> common.Bench:
  """The benchmark of one point: core attention on q, k, v or a layer on x."""
  mechanism, projection = common.parse_target(split_target(spec['target'])[0])
  dtype = jnp.dtype(spec['dtype'])
  b, n, h, d = spec['batch'], spec['length'], spec['heads'], spec['head_dim']
  if projection is None:
    q, k, v = common.random_qkv(spec['seed'], b, n, h, d, dtype)
    return common.mechanism_bench(
      mechanism,
      q,
      k,
      v,
      options=spec['options'],
      causal=spec['causal'],
      seed=spec['seed'],
      exact_implementation=spec['exact_implementation'],
    )
  x = jax.random.normal(jax.random.PRNGKey(spec['seed']), (b, n, h * d), dtype)
  return common.layer_bench(
    mechanism,
    projection,
    x,
    num_heads=h,
    options=spec['options'],
    causal=spec['causal'],
    seed=spec['seed'],
  )


def measure_point(spec: Dict[str, Any]) -> Dict[str, Any]:
  """Compiles, checks the memory budget, times. Returns the point's record."""
  rec: Dict[str, Any] = {}
  bench = build(spec)
  fn, args = bench.forward() if spec['mode'] == 'fwd' else bench.forward_backward()
  rss_baseline = common.peak_rss_bytes()
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  rec['compile_s'] = time.perf_counter() - start
  rec['memory_xla'] = xla_stats.memory(compiled)
  rec.update(xla_stats.flops(compiled))
  mem = (rec['memory_xla'] or {}).get('total')
  if mem is not None and spec['memory_budget_bytes'] and mem > spec['memory_budget_bytes']:
    rec.update(
      status='skipped',
      reason=(
        f"needs {output.fmt_bytes(mem)} by XLA's memory analysis > budget "
        f"{output.fmt_bytes(spec['memory_budget_bytes'])}"
      ),
    )
    return rec
  rec.update(
    common.time_compiled(compiled, args, repeats=spec['repeats'], budget_s=spec['time_budget_s'])
  )
  rec['rss_baseline_bytes'] = rss_baseline
  rec['rss_peak_bytes'] = common.peak_rss_bytes()
  rec['device_peak_bytes'] = common.device_peak_bytes()
  rec['status'] = 'ok'
  return rec


def run_isolated(spec: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
  """`measure_point` in a fresh interpreter; a crash (e.g. OOM kill) becomes 'failed'."""
  cmd = [sys.executable, '-m', 'benchmarks.speed', '--point_spec', json.dumps(spec)]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(
      [root] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
    ),
  )
  try:
    proc = subprocess.run(
      cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
    )
  except subprocess.TimeoutExpired:
    return dict(status='failed', reason=f'subprocess timed out after {timeout_s:.0f} s')
  lines = [l for l in proc.stdout.splitlines() if l.startswith('{')]
  if proc.returncode != 0 or not lines:
    tail = (proc.stderr.strip().splitlines() or [''])[-1][:200]
    why = (
      'killed by signal %d (out of memory?)' % -proc.returncode
      if proc.returncode < 0
      else f'exit code {proc.returncode}: {tail}'
    )
    return dict(status='failed', reason=why)
  return json.loads(lines[-1])


def safe_measure(spec: Dict[str, Any]) -> Dict[str, Any]:
  """`measure_point` in this process; an exception becomes a 'failed' record."""
  try:
    return measure_point(spec)
  except Exception as e:  # pylint: disable=broad-except  (recorded, run continues)
    msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ''
    return dict(status='failed', reason=f'{type(e).__name__}: {msg}')


# ----------------------------------------------------------------------------
# The sweep.
# ----------------------------------------------------------------------------


def target_lengths(args, target: str, lengths: Sequence[int]) -> List[int]:
  extra = []
  for item in args.extra_lengths:
    name, _, values = item.partition('=')
    if name == target:
      extra += common.csv_list(values, int)
  return sorted(set(lengths) | set(extra))


def headline_memory(rec: Dict[str, Any], isolate: bool, platform: str):
  """(bytes, source) of a point: RSS / device peak when isolated, else XLA's analysis."""
  if isolate and platform == 'cpu' and rec.get('rss_peak_bytes'):
    return rec['rss_peak_bytes'], 'rss'
  if isolate and rec.get('device_peak_bytes'):
    return rec['device_peak_bytes'], 'device'
  return (rec.get('memory_xla') or {}).get('total'), 'xla'


def sweep(
  args,
  targets: Sequence[str],
  lengths: Sequence[int],
  modes: Sequence[str],
  options: Dict[str, Dict[str, Any]],
  memory_budget: Optional[int],
  platform: str,
) -> List[Dict[str, Any]]:
  plan = [(t, m, n) for t in targets for m in modes for n in target_lengths(args, t, lengths)]
  if args.order == 'length':  # interleaved: every target at one length, then the next
    plan.sort(key=lambda p: p[2])  # stable: targets keep their order within a length
  points: List[Dict[str, Any]] = []
  over_budget = {}  # (target, mode) that already hit a budget or failed -> that status
  for i, (target, mode, n) in enumerate(plan):
    base, own = split_target(target)
    mechanism, projection = common.parse_target(base)
    spec = dict(
      target=target,
      mode=mode,
      length=n,
      batch=args.batch,
      heads=args.heads,
      head_dim=args.head_dim,
      dtype=args.dtype,
      causal=args.causal,
      options=dict(options.get(mechanism, {}), **own),
      repeats=args.repeats,
      time_budget_s=args.time_budget_s,
      memory_budget_bytes=memory_budget,
      seed=args.seed,
      exact_implementation=args.exact_implementation,
    )
    rec = dict(target=target, mechanism=mechanism, projection=projection, mode=mode, length=n)
    done = [
      p for p in points if p['target'] == target and p['mode'] == mode and p['status'] == 'ok'
    ]
    predicted = common.predict_time([p['length'] for p in done], [p['time_s'] for p in done], n)
    if (target, mode) in over_budget:
      rec.update(
        status='skipped',
        reason=(
          'a shorter length failed'
          if over_budget[(target, mode)] == 'failed'
          else 'a shorter length was already over budget'
        ),
      )
    elif predicted is not None and predicted > args.max_time_s:
      rec.update(
        status='skipped',
        reason=(f'predicted {predicted:.3g} s per call > --max_time_s={args.max_time_s:g}'),
      )
    elif args.isolate:
      rec.update(run_isolated(spec, args.point_timeout_s))
    else:
      rec.update(safe_measure(spec))
    if rec['status'] != 'ok':
      over_budget.setdefault((target, mode), rec['status'])
    else:
      if args.statistic == 'min':
        rec['median_s'], rec['time_s'] = rec['time_s'], rec['min_s']
      rec['memory_bytes'], rec['memory_source'] = headline_memory(rec, args.isolate, platform)
    points.append(rec)
    if not args.quiet:
      if rec['status'] == 'ok':
        what = (
          f"{output.fmt_time(rec['time_s'])} ({rec['runs']} runs), memory "
          f"{output.fmt_bytes(rec['memory_bytes'])} ({rec['memory_source']}), "
          f"compile {rec['compile_s']:.1f} s"
        )
      else:
        what = f"{rec['status']}: {rec['reason']}"
      print(f'[{i + 1:3d}/{len(plan)}] {target:24s} {mode:7s} n={n:6d}  {what}', flush=True)
  return points


# ----------------------------------------------------------------------------
# Summaries, tables, plots.
# ----------------------------------------------------------------------------


def lookup(points, target, mode, n, key='time_s'):
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
        ta, tb = lookup(points, a, mode, n), lookup(points, b, mode, n)
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
        time_exponent=common.fit_exponent(ns, [p['time_s'] for p in ok], fit_lo, fit_hi),
        memory_exponent=common.fit_exponent(ns, [p['memory_bytes'] for p in ok], fit_lo, fit_hi),
        fit_lengths=[n for n in ns if fit_lo <= n <= fit_hi],
        speedup_vs_exact={},
        memory_ratio_vs_exact={},
      )
      for p in ok:
        t_exact = lookup(points, common.EXACT, mode, p['length'])
        m_exact = lookup(points, common.EXACT, mode, p['length'], 'memory_bytes')
        if t_exact:
          entry['speedup_vs_exact'][p['length']] = t_exact / p['time_s']
        if m_exact and p.get('memory_bytes'):
          entry['memory_ratio_vs_exact'][p['length']] = p['memory_bytes'] / m_exact
      out[f'{target}:{mode}'] = entry
  return out


def exponent_cell(exponent, fit_lengths, lo, hi) -> str:
  """'1.02', or '1.98 (1024-8192)' when the measured points cover less than lo..hi."""
  if exponent is None:
    return None
  text = f'{exponent:.3g}'
  if fit_lengths and (min(fit_lengths) > lo or max(fit_lengths) < hi):
    text += f' ({min(fit_lengths)}-{max(fit_lengths)})'
  return text


def exponent_column(entries, kind: str):
  """('exponent lo-hi', cells) of the `kind` ('time' or 'memory') exponents of `entries`
  (`summarise`'s, one per row), lo-hi the lengths actually fitted; None when no row was
  fitted (fewer than two of its lengths inside --fit_range), so the table leaves it out."""
  fitted = [s for s in entries if s[f'{kind}_exponent'] is not None]
  if not fitted:
    return None
  lengths = [n for s in fitted for n in s['fit_lengths']]
  lo, hi = min(lengths), max(lengths)
  return f'exponent {lo}-{hi}', [
    exponent_cell(s[f'{kind}_exponent'], s['fit_lengths'], lo, hi) for s in entries
  ]


def with_column(heads, rows, column):
  """`heads` and `rows` with `column` (a header and a cell per row) appended, if any."""
  if column is None:
    return heads, rows
  return heads + [column[0]], [row + [cell] for row, cell in zip(rows, column[1])]


def causality(meta) -> str:
  """'causal', 'non-causal', or which targets ran causal because they are causal only."""
  if meta['causal']:
    return 'causal'
  only = meta.get('causal_only_targets', [])
  if only and len(only) == len(meta.get('targets', only)):
    return 'causal (every target is causal only)'
  if only:
    return f"non-causal, except the causal-only {', '.join(only)} (causal)"
  return 'non-causal'


def markdown(meta, points, summary, targets, modes, ratios=None) -> str:
  fit_lo, fit_hi = meta['fit_range']
  notes = [
    f"batch {meta['batch']}, {meta['heads']} heads, head_dim {meta['head_dim']}, "
    f"{meta['dtype']}, {causality(meta)}; 'exact' is "
    f"`jax.nn.dot_product_attention` (implementation: {meta['exact_implementation']}); "
    "layers 'mechanism/projection' are whole MultiHeadAttention layers "
    f"(d_model = {meta['heads'] * meta['head_dim']}).",
    f"time: {meta['statistic']} of up to {meta['repeats']} calls after compilation and one "
    "warm-up "
    f"(block_until_ready), fewer once they pass {meta['time_budget_s'] / 2:g} s; a warm-up "
    f"over {meta['time_budget_s']:g} s is the single measurement; points predicted over "
    f"{meta['max_time_s']:g} s per call are skipped.",
    f"memory: {meta['memory_description']}",
    f"exponent: slope of log(time) against log(length) over lengths {fit_lo}..{fit_hi} "
    '(only measured points).',
    'options: '
    + '; '.join(
      f'{k}: ' + ', '.join(f'{option}={v}' for option, v in opts.items() if v is not None)
      for k, opts in meta['options'].items()
      if opts
    ),
  ]
  why = no_speedup(summary, targets, modes)
  if why:
    notes.append(why)
  parts = [output.header('Attention speed and memory', meta['device_line'], notes)]
  all_ns = sorted({p['length'] for p in points})
  for mode in modes:
    title = MODE_TITLES[mode]
    rows, sp_rows, mem_rows = [], [], []
    entries = [summary[f'{t}:{mode}'] for t in targets]
    for t, s in zip(targets, entries):
      rows.append([t] + [output.fmt_time(lookup(points, t, mode, n)) for n in all_ns])
      sp_rows.append([t] + [output.fmt_num(s['speedup_vs_exact'].get(n), 3) for n in all_ns])
      mem_rows.append(
        [t] + [output.fmt_bytes(lookup(points, t, mode, n, 'memory_bytes')) for n in all_ns]
      )
    heads = ['target'] + [str(n) for n in all_ns]
    parts += [
      f'## {title}: time per call',
      '',
      output.table(*with_column(heads, rows, exponent_column(entries, 'time'))),
      '',
    ]
    if any(s['speedup_vs_exact'] for s in entries):  # else every cell would be '-'
      parts += [
        f'## {title}: speedup vs exact (time of exact / time)',
        '',
        output.table(heads, sp_rows),
        '',
      ]
    parts += [
      f'## {title}: peak memory ({meta["memory_source"]})',
      '',
      output.table(*with_column(heads, mem_rows, exponent_column(entries, 'memory'))),
      '',
    ]
  if ratios:
    all_ns = sorted({p['length'] for p in points})
    for mode in modes:
      rows = [
        [f'{a} / {b}'] + [output.fmt_num(ratios[f'{a}:{b}:{mode}'].get(n), 3) for n in all_ns]
        for a, b in meta['compare']
      ]
      parts += [
        f'## {MODE_TITLES[mode]}: time ratios (--compare a:b, time of a / time of b)',
        '',
        output.table(['a / b'] + [str(n) for n in all_ns], rows),
        '',
      ]
  missing = [p for p in points if p['status'] != 'ok']
  if missing:
    parts += [
      '## Points not measured',
      '',
      output.table(
        ['target', 'mode', 'length', 'status', 'reason'],
        [[p['target'], p['mode'], p['length'], p['status'], p['reason']] for p in missing],
        'lllll',
      ),
      '',
    ]
  return '\n'.join(parts)


def no_speedup(summary, targets, modes) -> Optional[str]:
  """One line saying why there is no speedup plot (time of exact / time), or None when
  'exact' was measured at some length."""
  if any(summary[f'{t}:{m}']['speedup_vs_exact'] for t in targets for m in modes):
    return None
  why = (
    "'exact' is not among the targets"
    if common.EXACT not in targets
    else "'exact' was not measured at any length (see the points not measured)"
  )
  return f'no speedup plot or table (time of exact / time of the target): {why}.'


def plots(out, name, meta, points, summary, targets, modes) -> List[str]:
  def series(key, values=None):
    panels = []
    for mode in modes:
      s = {}
      for t in targets:
        ns = sorted({p['length'] for p in points if p['target'] == t and p['mode'] == mode})
        ys = [(values(t, mode, n) if values else lookup(points, t, mode, n, key)) for n in ns]
        exp = summary[f'{t}:{mode}']['time_exponent']
        label = t if key != 'time_s' or exp is None else f'{t} (slope {exp:.2f})'
        s[label] = (ns, ys)
      panels.append((MODE_TITLES[mode], s))
    return panels

  sub = (
    f"batch {meta['batch']}, {meta['heads']} heads, head_dim {meta['head_dim']}, "
    f"{meta['dtype']} — {meta['device_line']}"
  )
  mem_unit = lambda t, m, n: ((lookup(points, t, m, n, 'memory_bytes') or 0) / 2**20) or None
  pngs = [
    output.line_plot(
      os.path.join(out, f'{name}_time.png'),
      series('time_s'),
      xlabel='sequence length (tokens)',
      ylabel='time per call (s)',
      suptitle='Attention time vs length (log-log); ' + sub,
    ),
    output.line_plot(
      os.path.join(out, f'{name}_memory.png'),
      series(None, mem_unit),
      xlabel='sequence length (tokens)',
      ylabel=f"peak memory (MiB, {meta['memory_source']})",
      suptitle='Attention peak memory vs length (log-log); ' + sub,
    ),
  ]
  speedup = os.path.join(out, f'{name}_speedup.png')
  if no_speedup(summary, targets, modes) is None:
    pngs.append(
      output.line_plot(
        speedup,
        series(None, lambda t, m, n: summary[f'{t}:{m}']['speedup_vs_exact'].get(n)),
        xlabel='sequence length (tokens)',
        ylabel='speedup vs exact (×)',
        suptitle='time of exact attention / time of target; ' + sub,
        hlines=[(1.0, 'exact')],
      )
    )
  elif os.path.exists(speedup):  # an earlier run's: it is not this run's
    os.remove(speedup)
  return pngs


def select_targets(args) -> List[str]:
  """What to measure, from --mechanisms or --targets, and --layers (see the module's
  docstring). Raises ValueError naming the flag for a bad name, a layer in --mechanisms,
  or --mechanisms and --targets that name different lists."""
  mechanisms = common.csv_list(args.mechanisms) if args.mechanisms else []
  targets = common.csv_list(args.targets) if args.targets else []
  if mechanisms and targets and mechanisms != targets:
    raise ValueError(
      f'--mechanisms={args.mechanisms!r} and --targets={args.targets!r} '
      'name different lists; give one (--mechanisms: exact and mechanisms; '
      "--targets: also layers 'mechanism/projection')"
    )
  flag = '--mechanisms' if mechanisms else '--targets'
  chosen = mechanisms or targets
  for t in chosen:
    if '/' in t.split('@')[0] and flag == '--mechanisms':
      raise ValueError(
        f"--mechanisms={args.mechanisms!r} is not valid: {t!r} is a layer "
        "'mechanism/projection'; valid: exact and mechanisms (layers go in "
        '--layers or --targets)'
      )
  out = chosen or [common.EXACT] + list(common.available_mechanisms())
  layers = common.csv_list(args.layers) if args['layers'].present or not chosen else []
  out = list(dict.fromkeys(out + layers))  # in order, once each
  for t in out:
    try:
      split_target(t)
    except ValueError as e:
      raise ValueError(f'{flag} / --layers: {e}') from None
  return out


def positive_lengths(text: str, flag: str) -> List[int]:
  """'256,1024' -> [256, 1024]; ValueError naming `flag` for an item that is not a
  positive integer (a length 0 would time an empty problem)."""
  lengths = common.csv_list(text, int, flag)
  for n in lengths:
    if n < 1:
      raise ValueError(
        f'{flag}={text!r} is not valid: {n} is not a positive integer; '
        'valid: a comma list of positive integers'
      )
  return lengths


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = common.parse_flags(define_flags, argv, __doc__)
  if args.point_spec is not None:  # a subprocess of --isolate
    spec = json.loads(args.point_spec)
    print(json.dumps(output.jsonable(safe_measure(spec))))
    return {}
  info = common.device_info()
  platform = info['platform']
  with common.flag_errors():
    targets = select_targets(args)
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
      positive_lengths(args.lengths, '--lengths')
      if args.lengths
      else list(CPU_LENGTHS if platform == 'cpu' else ACCEL_LENGTHS)
    )
    for item in args.extra_lengths:
      target, _, values = item.partition('=')
      if target not in targets:
        raise ValueError(
          f'--extra_lengths={item!r}: {target!r} is not one of the targets ({", ".join(targets)})'
        )
      positive_lengths(values, f'--extra_lengths of {target}')
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
    mechanisms = sorted({common.parse_target(split_target(t)[0])[0] for t in targets})
    options = {m: common.effective_options(m, overrides.get(m)) for m in mechanisms}
    fit_range = common.csv_list(args.fit_range, int, '--fit_range')
    if len(fit_range) != 2:
      raise ValueError(f'--fit_range={args.fit_range!r} is not valid; valid: two lengths lo,hi')
    fit_lo, fit_hi = fit_range
  memory_budget = (
    int(args.memory_budget_gb * 2**30)
    if args.memory_budget_gb
    else int(0.85 * (common.total_memory_bytes() or 0)) or None
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
    device_line=common.describe_device(info),
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
      if common.parse_target(split_target(t)[0])[0] != common.EXACT
      and ea.get_mechanism(common.parse_target(split_target(t)[0])[0]).causal_only
    ],
    command=output.command('benchmarks.speed', argv),
  )
  start = time.time()
  points = sweep(args, targets, lengths, modes, options, memory_budget, platform)
  meta['wall_time_s'] = time.time() - start
  summary = summarise(points, targets, modes, fit_lo, fit_hi)
  ratios = compare_ratios(points, compare, modes)
  pngs = plots(args.out, args.name, meta, points, summary, targets, modes)
  data = dict(meta=meta, targets=targets, points=points, summary=summary, ratios=ratios, plots=pngs)
  output.finish(
    args.out,
    args.name,
    data,
    markdown(meta, points, summary, targets, modes, ratios),
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

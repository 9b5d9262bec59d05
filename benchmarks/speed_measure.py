"""benchmarks.speed's measurement: one point (a target, a mode and a length) compiled, timed
and its memory read, in this process or in a fresh one (--isolate), and every point of a
run in turn."""

import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp

from benchmarks import attention_bench
from benchmarks import machine
from benchmarks import output
from benchmarks import speed_targets
from benchmarks import timing
from benchmarks import xla_stats


def build_bench(spec: Dict[str, Any]) -> attention_bench.Bench:
  """The benchmark of one point: core attention on q, k, v or a layer on x."""
  mechanism, projection = attention_bench.parse_target(
    speed_targets.split_target(spec['target'])[0]
  )
  dtype = jnp.dtype(spec['dtype'])
  b, n, h, d = spec['batch'], spec['length'], spec['heads'], spec['head_dim']
  if projection is None:
    q, k, v = attention_bench.random_qkv(spec['seed'], b, n, h, d, dtype)
    return attention_bench.mechanism_bench(
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
  return attention_bench.layer_bench(
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
  bench = build_bench(spec)
  fn, args = bench.forward() if spec['mode'] == 'fwd' else bench.forward_backward()
  rss_baseline = machine.peak_rss_bytes()
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
    timing.time_compiled(compiled, args, repeats=spec['repeats'], budget_s=spec['time_budget_s'])
  )
  rec['rss_baseline_bytes'] = rss_baseline
  rec['rss_peak_bytes'] = machine.peak_rss_bytes()
  rec['device_peak_bytes'] = machine.device_peak_bytes()
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


def headline_memory(rec: Dict[str, Any], isolate: bool, platform: str):
  """(bytes, source) of a point: RSS / device peak when isolated, else XLA's analysis."""
  if isolate and platform == 'cpu' and rec.get('rss_peak_bytes'):
    return rec['rss_peak_bytes'], 'rss'
  if isolate and rec.get('device_peak_bytes'):
    return rec['device_peak_bytes'], 'device'
  return (rec.get('memory_xla') or {}).get('total'), 'xla'


def measure_points(
  args,
  targets: Sequence[str],
  lengths: Sequence[int],
  modes: Sequence[str],
  options: Dict[str, Dict[str, Any]],
  memory_budget: Optional[int],
  platform: str,
) -> List[Dict[str, Any]]:
  plan = [
    (t, m, n)
    for t in targets
    for m in modes
    for n in speed_targets.target_lengths(args, t, lengths)
  ]
  if args.order == 'length':  # interleaved: every target at one length, then the next
    plan.sort(key=lambda p: p[2])  # stable: targets keep their order within a length
  points: List[Dict[str, Any]] = []
  over_budget = {}  # (target, mode) that already hit a budget or failed -> that status
  for i, (target, mode, n) in enumerate(plan):
    base, own = speed_targets.split_target(target)
    mechanism, projection = attention_bench.parse_target(base)
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
    predicted = timing.predict_time([p['length'] for p in done], [p['time_s'] for p in done], n)
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

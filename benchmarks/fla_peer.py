r"""The gated family against flash-linear-attention's kernels: forward + backward and decoding.

For each recurrence, the bare chunkwise core (no projections, convolution or norm: what
fla's `chunk_*` ops compute) on the same random inputs:

  ours   `efficient_attn.ops.gated` / `efficient_attn.ops.delta` chunk form with implementation
         'xla' and 'pallas' (`efficient_attn.ops.kernels`), in bfloat16 and float32 inputs;
  fla    `fla.ops` (PyTorch + Triton) as published (`benchmarks.published.fla`), bfloat16.

    recurrence       ours                                   fla
    retention        scalar decay, fixed per head          chunk_retention
    mamba2           scalar decay from the token (SSD)     chunk_simple_gla (g [B, T, H])
    gla              decay per key feature                  chunk_gla (g [B, T, H, K])
    deltanet         delta rule                             chunk_delta_rule
    gated_deltanet   delta rule with a scalar decay         chunk_gated_delta_rule

Forward + backward is the gradient of sum(out * do) with respect to q, k, v and the gates
(decays, beta), timed as the median of --repeats calls after a warm-up (CUDA events for
fla, `block_until_ready` for JAX). Decoding is one token's step with a state of its
size, per token. Memory is XLA's compiled footprint (arguments + outputs + temporaries)
for ours and torch's peak allocation for fla.

Head layouts (--layouts): 'heads' is --heads heads of --head_dim for q, k and v (the issue's
batch 4, 16 heads of 128); 'paper' is each paper's own: Mamba-2 with ngroups=1 (one B and C
of d_state 128 shared by 32 heads of 64 values, repeated to the heads for both sides), Gated
DeltaNet as fla's default (6 heads, keys of 256, values of 512); the others keep 'heads'.
Lengths of 64K and over run at batch 1.

    python -m benchmarks.fla_peer --out=docs/results --name=gated_gpu        # on a GPU
    python -m benchmarks.fla_peer --dry_run --out=/tmp/fla_dry                # any machine

--dry_run runs every part at tiny sizes (on CPU, 'pallas' in interpret mode); fla is
skipped with one line wherever it cannot run (no source, no torch, no GPU).
"""

import time
from typing import Any, Callable, Dict, List, Optional

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks import output
from benchmarks.published import fla as published_fla
from efficient_attn.ops import delta
from efficient_attn.ops import gated
from efficient_attn.ops import kernels

RECURRENCES = ('retention', 'mamba2', 'gla', 'deltanet', 'gated_deltanet')
IMPLEMENTATIONS = ('xla', 'pallas')
DTYPES = ('bfloat16', 'float32')
LAYOUTS = ('heads', 'paper')
LONG = 65536  # from this length on, batch 1
FLA_OPS = {
  'retention': 'chunk_retention',
  'mamba2': 'chunk_simple_gla',
  'gla': 'chunk_gla',
  'deltanet': 'chunk_delta_rule',
  'gated_deltanet': 'chunk_gated_delta_rule',
}
FLA_STEPS = {
  'retention': 'fused_recurrent_retention',
  'mamba2': 'fused_recurrent_simple_gla',
  'gla': 'fused_recurrent_gla',
  'deltanet': 'fused_recurrent_delta_rule',
  'gated_deltanet': 'fused_recurrent_gated_delta_rule',
}


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/fla_peer', name='gated_gpu')
  flags.DEFINE_string(
    'recurrences', ','.join(RECURRENCES), 'comma list of: ' + ', '.join(RECURRENCES), flag_values=fv
  )
  flags.DEFINE_string(
    'implementations',
    ','.join(IMPLEMENTATIONS),
    'ours, comma list of: ' + ', '.join(IMPLEMENTATIONS),
    flag_values=fv,
  )
  flags.DEFINE_string(
    'dtypes', ','.join(DTYPES), 'our input dtypes (fla: bfloat16)', flag_values=fv
  )
  flags.DEFINE_string(
    'lengths', '4096,16384,65536', f'comma list; >= {LONG} at batch 1', flag_values=fv
  )
  flags.DEFINE_string(
    'layouts', 'heads,paper', 'comma list of: ' + ', '.join(LAYOUTS), flag_values=fv
  )
  flags.DEFINE_integer('batch', 4, 'batch below 64K tokens', flag_values=fv)
  flags.DEFINE_integer('heads', 16, "heads of the 'heads' layout", flag_values=fv)
  flags.DEFINE_integer('head_dim', 128, "q, k and v width of the 'heads' layout", flag_values=fv)
  flags.DEFINE_integer('chunk_size', 64, 'chunk of every chunkwise form (fla: 64)', flag_values=fv)
  flags.DEFINE_integer(
    'repeats', 10, 'timed calls per point (median)', lower_bound=1, flag_values=fv
  )
  flags.DEFINE_float('budget_s', 20.0, 'seconds of timed calls per point at most', flag_values=fv)
  flags.DEFINE_bool('decode', True, 'also time one decoding step', flag_values=fv)
  flags.DEFINE_bool(
    'fla',
    True,
    "also time fla's kernels (skipped in one line where they cannot run)",
    flag_values=fv,
  )
  flags.DEFINE_bool(
    'dry_run',
    False,
    'tiny sizes (lengths 64 and 96, batch 1, 2 heads of '
    '16, chunk 16, 2 repeats): every part, on any machine',
    flag_values=fv,
  )


# ----------------------------------------------------------------------------
# Problems: shapes and random inputs, the same for both sides.
# ----------------------------------------------------------------------------


def shapes(recurrence: str, layout: str, heads: int, head_dim: int) -> Dict[str, int]:
  """heads, dk, dv (and qk_groups: heads sharing one q/k) of a recurrence in a layout."""
  if layout == 'paper' and recurrence == 'mamba2':
    return dict(heads=32, dk=128, dv=64, qk_groups=1)
  if layout == 'paper' and recurrence == 'gated_deltanet':
    return dict(heads=6, dk=256, dv=512, qk_groups=6)
  return dict(heads=heads, dk=head_dim, dv=head_dim, qk_groups=heads)


def inputs(recurrence: str, batch: int, length: int, s: Dict[str, int], seed: int = 0):
  """Float32 NumPy q, k, v `[b, n, h, d]`, log-decay g (`[b, n, h, 1]` or `[b, n, h, dk]`, or
  None) and beta (`[b, n, h]` or None), as the mechanisms make them: keys L2-normalised for
  the delta rule, decays in a trained model's range."""
  rng = np.random.default_rng(seed)
  b, n, h, dk, dv = batch, length, s['heads'], s['dk'], s['dv']
  q, k = (rng.standard_normal((b, n, s['qk_groups'], dk), np.float32) for _ in range(2))
  q, k = (np.repeat(x, h // s['qk_groups'], axis=2) for x in (q, k))
  v = rng.standard_normal((b, n, h, dv), np.float32)
  g = beta = None
  if recurrence == 'retention':
    g = np.broadcast_to(
      np.log1p(-(2.0 ** (-5.0 - np.arange(h, dtype=np.float32))))[:, None], (b, n, h, 1)
    ).copy()
  elif recurrence in ('mamba2', 'gated_deltanet'):
    g = -rng.uniform(0.001, 0.1, (b, n, h, 1)).astype(np.float32)
  elif recurrence == 'gla':
    g = np.log(rng.uniform(0.9, 1.0, (b, n, h, dk))).astype(np.float32)
  if recurrence in ('deltanet', 'gated_deltanet'):
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    beta = rng.uniform(0.1, 0.9, (b, n, h)).astype(np.float32)
  q = q / np.sqrt(dk)  # the mechanisms scale queries (fla: scale=1 below)
  return q, k, v, g, beta


# ----------------------------------------------------------------------------
# Ours.
# ----------------------------------------------------------------------------


def our_core(recurrence: str, implementation: str) -> Optional[Callable[..., Any]]:
  """`core(q, k, v, g, beta, state=None, chunk_size=c) -> (out, state)` of the chunk form:
  the XLA form ('xla') or the Pallas kernels ('pallas', `efficient_attn.ops.kernels`)."""
  is_delta = recurrence in ('deltanet', 'gated_deltanet')
  if implementation == 'xla':
    return delta.delta_chunked if is_delta else gated.gated_chunked
  return kernels.delta_chunked if is_delta else kernels.decay_chunked


def our_step(recurrence: str) -> Callable[..., Any]:
  return delta.delta_step if recurrence in ('deltanet', 'gated_deltanet') else gated.gated_step


def memory_bytes(compiled) -> Optional[int]:
  """Arguments + outputs + temporaries of a compiled program (None where XLA says nothing)."""
  try:
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)
  except Exception:  # pylint: disable=broad-except
    return None


def time_ours(
  core, q, k, v, g, beta, *, dtype: str, chunk_size: int, repeats: int, budget_s: float
) -> Dict[str, Any]:
  """Forward + backward of `core` on the inputs cast to `dtype` (gates stay float32)."""
  cast = lambda x: None if x is None else jnp.asarray(x, dtype)
  q, k, v = (cast(x) for x in (q, k, v))
  g, beta = (None if x is None else jnp.asarray(x) for x in (g, beta))
  do = jnp.ones(v.shape, jnp.float32)

  def loss(q, k, v, g, beta):
    out, _ = core(q, k, v, g, beta, chunk_size=chunk_size)
    return jnp.sum(out.astype(jnp.float32) * do)

  grad = jax.jit(
    jax.grad(loss, argnums=tuple(i for i, x in enumerate((q, k, v, g, beta)) if x is not None))
  )
  start = time.perf_counter()
  compiled = grad.lower(q, k, v, g, beta).compile()
  compile_s = time.perf_counter() - start
  timing = common.time_compiled(compiled, (q, k, v, g, beta), repeats=repeats, budget_s=budget_s)
  return dict(time_s=timing['time_s'], compile_s=compile_s, memory_bytes=memory_bytes(compiled))


def time_our_step(recurrence: str, q, k, v, g, beta, *, repeats: int) -> float:
  """Seconds per decoding step (batch, heads and widths of the inputs), float32 state."""
  step = jax.jit(our_step(recurrence))
  b, _, h, dk = q.shape
  s = jnp.zeros((b, h, dk, v.shape[-1]), jnp.float32)
  first = lambda x: None if x is None else jnp.asarray(x[:, 0])  # token 0: [b, h, ...]
  args = (s, first(q), first(k), first(v), first(g), first(beta))
  common.block(step(*args))
  times = []
  for _ in range(max(1, repeats)):
    start = time.perf_counter()
    common.block(step(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


# ----------------------------------------------------------------------------
# fla.
# ----------------------------------------------------------------------------


def fla_call(ops, recurrence: str, q, k, v, g, beta, *, step: bool = False, state=None):
  """One call of fla's chunk op (or, with `step`, its fused recurrent op) on torch tensors
  `[B, T, H, D]`: returns (out, final state)."""
  name = (FLA_STEPS if step else FLA_OPS)[recurrence]
  module = getattr(
    ops,
    {'mamba2': 'simple_gla', 'deltanet': 'delta_rule', 'gated_deltanet': 'gated_delta_rule'}.get(
      recurrence, recurrence
    ),
  )
  fn = getattr(module, name)
  kw = dict(scale=1.0, initial_state=state, output_final_state=True)
  if recurrence == 'retention':
    return fn(q, k, v, **kw)
  if recurrence == 'gla':
    return fn(q, k, v, gk=g, **kw) if step else fn(q, k, v, g=g, **kw)
  if recurrence == 'mamba2':
    return fn(q, k, v, g=g[..., 0], **kw)
  if recurrence == 'deltanet':
    return fn(q, k, v, beta=beta, **kw)
  return fn(q, k, v, g=g[..., 0], beta=beta, **kw)


def time_fla(ops, recurrence: str, q, k, v, g, beta, *, repeats: int) -> Dict[str, Any]:
  """fla's forward + backward (bfloat16 q, k, v; float32 gates) with CUDA events, its peak
  memory, and one decoding step's latency."""
  import torch  # pylint: disable=g-import-not-at-top

  dev = 'cuda'
  bf = lambda x: torch.tensor(x, device=dev, dtype=torch.bfloat16).requires_grad_()
  f32 = lambda x: None if x is None else torch.tensor(x, device=dev).requires_grad_()
  tq, tk, tv = bf(q), bf(k), bf(v)
  tg, tb = f32(g), f32(beta)
  do = torch.ones_like(tv)

  def once():
    out, _ = fla_call(ops, recurrence, tq, tk, tv, tg, tb)
    out.backward(do)

  once()
  torch.cuda.synchronize()
  torch.cuda.reset_peak_memory_stats()
  base = torch.cuda.memory_allocated()
  times = []
  for _ in range(max(1, repeats)):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    once()
    end.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
  peak = torch.cuda.max_memory_allocated() - base
  return dict(time_s=float(np.median(times)), memory_bytes=int(peak))


def time_fla_step(ops, recurrence: str, q, k, v, g, beta, *, repeats: int) -> float:
  """Seconds per token of fla's fused recurrent op with a state (bfloat16 inputs)."""
  import torch  # pylint: disable=g-import-not-at-top

  one = lambda x, dt=torch.bfloat16: (
    None if x is None else torch.tensor(x[:, :1], device='cuda', dtype=dt)
  )
  tq, tk, tv, tg, tb = one(q), one(k), one(v), one(g, torch.float32), one(beta, torch.float32)
  state = torch.zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3], device='cuda')
  with torch.no_grad():
    fla_call(ops, recurrence, tq, tk, tv, tg, tb, step=True, state=state)
    torch.cuda.synchronize()
    times = []
    for _ in range(max(1, repeats)):
      start = time.perf_counter()
      fla_call(ops, recurrence, tq, tk, tv, tg, tb, step=True, state=state)
      torch.cuda.synchronize()
      times.append(time.perf_counter() - start)
  return float(np.median(times))


# ----------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------


def check_flags(fv) -> Dict[str, Any]:
  """The flags' lists, or a one-line ValueError naming a bad value and the valid ones."""
  picked = {}
  for flag, valid in (
    ('recurrences', RECURRENCES),
    ('implementations', IMPLEMENTATIONS),
    ('dtypes', DTYPES),
    ('layouts', LAYOUTS),
  ):
    values = common.csv_list(getattr(fv, flag), flag=flag)
    bad = [x for x in values if x not in valid]
    if bad or not values:
      raise ValueError(
        f'--{flag}={getattr(fv, flag)!r} is not valid; valid values: {", ".join(valid)}'
      )
    picked[flag] = values
  picked['lengths'] = common.csv_list(fv.lengths, int, flag='lengths')
  for flag, value in (
    ('batch', fv.batch),
    ('heads', fv.heads),
    ('head_dim', fv.head_dim),
    ('chunk_size', fv.chunk_size),
    ('repeats', fv.repeats),
  ):
    if value < 1:
      raise ValueError(f'--{flag}={value} is not valid; it must be >= 1')
  if min(picked['lengths']) < 1:
    raise ValueError(f'--lengths={fv.lengths!r} is not valid; every length must be >= 1')
  return picked


def run(fv) -> Dict[str, Any]:
  with common.flag_errors():
    picked = check_flags(fv)
  heads, head_dim, chunk, repeats, batch = (
    fv.heads,
    fv.head_dim,
    fv.chunk_size,
    fv.repeats,
    fv.batch,
  )
  if fv.dry_run:
    picked['lengths'], heads, head_dim, chunk, repeats, batch = [64, 96], 2, 16, 16, 2, 1
  say = (lambda *a: None) if fv.quiet else (lambda text: common.emit(text))
  reason = published_fla.why_missing() if fv.fla else '--nofla'
  ops = None
  if reason:
    say(f'fla skipped: {reason}')
  else:
    ops = published_fla.ops()
  rows: List[Dict[str, Any]] = []
  for layout in picked['layouts']:
    for recurrence in picked['recurrences']:
      s = shapes(recurrence, layout, heads, head_dim)
      if fv.dry_run:
        s = {k: min(v, 4 if k == 'heads' else 16) for k, v in s.items()}
        s['qk_groups'] = 1 if s['qk_groups'] < s['heads'] else s['heads']
      if layout == 'paper' and recurrence not in ('mamba2', 'gated_deltanet'):
        continue
      for length in picked['lengths']:
        b = 1 if length >= LONG else batch
        data = inputs(recurrence, b, length, s)
        row = dict(recurrence=recurrence, layout=layout, length=length, batch=b, **s)
        for impl in picked['implementations']:
          core = our_core(recurrence, impl)
          for dtype in picked['dtypes']:
            key = f'{impl}_{dtype}'
            if core is None:
              row[key] = dict(skipped=f'no {impl} form of {recurrence}')
              continue
            try:
              row[key] = time_ours(
                core, *data, dtype=dtype, chunk_size=chunk, repeats=repeats, budget_s=fv.budget_s
              )
            except Exception as e:  # pylint: disable=broad-except
              row[key] = dict(failed=f'{type(e).__name__}: {str(e).splitlines()[0][:200]}')
        if ops is not None:
          try:
            row['fla_bfloat16'] = time_fla(ops, recurrence, *data, repeats=repeats)
          except Exception as e:  # pylint: disable=broad-except
            row['fla_bfloat16'] = dict(failed=f'{type(e).__name__}: {str(e)[:200]}')
        if fv.decode and length == picked['lengths'][0]:
          row['decode_ours_s'] = time_our_step(recurrence, *data, repeats=repeats)
          if ops is not None:
            row['decode_fla_s'] = time_fla_step(ops, recurrence, *data, repeats=repeats)
        rows.append(row)
        say(
          f'{recurrence} {layout} n={length}: '
          + ', '.join(
            f'{k} {v["time_s"] * 1e3:.3g} ms'
            for k, v in row.items()
            if isinstance(v, dict) and 'time_s' in v
          )
        )
  measured = [r for r in rows for v in r.values() if isinstance(v, dict) and 'time_s' in v]
  if not measured:
    raise SystemExit('Error: every point failed or was skipped; nothing to report')
  return dict(
    rows=rows,
    fla=dict(published_fla.FLA, skipped=reason or ''),
    device=common.device_info(),
    chunk_size=chunk,
    dry_run=fv.dry_run,
  )


def markdown(result: Dict[str, Any]) -> str:
  """One row per recurrence, layout and length: milliseconds per forward + backward, the
  ratio of each of ours to fla's, and decoding latency per token."""
  columns = sorted(
    {k for r in result['rows'] for k, v in r.items() if isinstance(v, dict) and k != 'fla_bfloat16'}
  )
  has_fla = any('fla_bfloat16' in r for r in result['rows'])
  headers = (
    ['recurrence', 'layout', 'B x T x H x (dk, dv)']
    + [f'{c} ms' for c in columns]
    + (['fla bfloat16 ms'] + [f'{c} / fla' for c in columns] if has_fla else [])
    + ['decode ours us', 'decode fla us']
  )

  def ms(cell):
    if not isinstance(cell, dict):
      return '-'
    return (
      f"{cell['time_s'] * 1e3:.3g}"
      if 'time_s' in cell
      else 'skipped'
      if 'skipped' in cell
      else 'failed'
    )

  body = []
  for r in result['rows']:
    fla = r.get('fla_bfloat16', {})
    ratios = (
      [
        f"{r[c]['time_s'] / fla['time_s']:.2f}"
        if 'time_s' in r.get(c, {}) and 'time_s' in fla
        else '-'
        for c in columns
      ]
      if has_fla
      else []
    )
    us = lambda key: f'{r[key] * 1e6:.1f}' if key in r else '-'
    body.append(
      [
        r['recurrence'],
        r['layout'],
        f"{r['batch']} x {r['length']} x {r['heads']} x ({r['dk']}, {r['dv']})",
      ]
      + [ms(r.get(c)) for c in columns]
      + ([ms(fla)] + ratios if has_fla else [])
      + [us('decode_ours_s'), us('decode_fla_s')]
    )
  return output.table(headers, body)


def main(argv=None) -> None:
  fv = common.parse_flags(define_flags, argv, __doc__)
  result = run(fv)
  notes = [
    f"fla: {result['fla']['repo']} at {result['fla']['commit'][:12]}"
    + (f" (skipped: {result['fla']['skipped']})" if result['fla']['skipped'] else ''),
    f"chunk {result['chunk_size']}; forward + backward of sum(out * do) w.r.t. q, k, v "
    f'and the gates; decoding: one step with a float32 state',
  ]
  output.finish_table(
    fv.out,
    fv.name,
    'The gated family against fla',
    common.describe_device(result['device']),
    notes,
    markdown(result),
    result,
    quiet=fv.quiet,
  )


if __name__ == '__main__':
  main()

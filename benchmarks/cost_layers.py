"""benchmarks.cost's measurement: the parameters, FLOPs and XLA memory of one attention layer,
and the parameter counts of Hosseini & Hosseini (2024)'s tables recomputed."""

from typing import Any, Dict, List

import jax
import jax.numpy as jnp

from benchmarks import attention_bench
from benchmarks import output
from benchmarks import xla_stats

# The per-layer "# Param." columns of Hosseini & Hosseini (2024):
# (dataset, heads, d_m, context l) -> {projection: count}; ImageNet's are printed rounded
# to 3 significant digits.
PAPER_PARAMS = (
  (
    'MNIST (Table 5)',
    4,
    128,
    64,
    dict(standard=66_048, optimised=49_536, efficient=33_024, super=37_184),
  ),
  (
    'CIFAR100 (Table 6)',
    8,
    256,
    257,
    dict(standard=263_168, optimised=197_376, efficient=131_584, super=197_890),
  ),
  (
    'ImageNet (Table 1)',
    12,
    768,
    196,
    dict(standard=2_360_000, optimised=1_770_000, efficient=1_180_000, super=1_220_000),
  ),
  (
    'IMDB (Table 8)',
    4,
    32,
    32,
    dict(standard=4_224, optimised=3_168, efficient=2_112, super=3_168),
  ),
  (
    'Amazon Reviews (Table 9)',
    4,
    64,
    64,
    dict(standard=16_640, optimised=12_480, efficient=8_320, super=12_480),
  ),
)
ROUNDED = ('ImageNet (Table 1)',)


def param_formula(projection: str, d: int, l: int) -> int:
  """Hosseini & Hosseini (2024): standard 4(d²+d), optimised 3(d²+d), efficient 2(d²+d),
  super 2(d²+d)+l²+l."""
  base = {'standard': 4, 'optimised': 3, 'efficient': 2, 'super': 2}[projection] * (d * d + d)
  return base + (l * l + l if projection == 'super' else 0)


def layer_cost(
  mechanism: str,
  projection: str,
  *,
  d_model: int,
  heads: int,
  length: int,
  batch: int,
  options: Dict[str, Any],
  modes=('fwd', 'fwd_bwd'),
) -> Dict[str, Any]:
  """Parameters, FLOPs and XLA memory of one layer (see module docstring)."""
  x = jax.ShapeDtypeStruct((batch, length, d_model), jnp.float32)
  bench = attention_bench.layer_bench(mechanism, projection, x, num_heads=heads, options=options)
  params = bench.variables.get('params', {})
  mech_params = attention_bench.count_params(params.get('mechanism', {}))
  rec = dict(
    mechanism=mechanism,
    projection=projection,
    d_model=d_model,
    heads=heads,
    length=length,
    batch=batch,
    params_total=attention_bench.count_params(params),
    params_mechanism=mech_params,
  )
  rec['params_projection'] = rec['params_total'] - mech_params
  for mode in modes:
    fn, args = bench.forward() if mode == 'fwd' else bench.forward_backward()
    compiled = jax.jit(fn).lower(*args).compile()
    stats = xla_stats.flops(compiled)
    rec[f'{mode}_flops'] = stats['flops']
    rec[f'{mode}_flops_xla'] = stats['flops_xla']
    rec[f'{mode}_loops'] = stats['loops']
    rec[f'{mode}_memory_bytes'] = (xla_stats.memory(compiled) or {}).get('total')
  return rec


def safe_cost(args, mechanism, projection, length, options, modes) -> Dict[str, Any]:
  try:
    rec = layer_cost(
      mechanism,
      projection,
      d_model=args.d_model,
      heads=args.heads,
      length=length,
      batch=args.batch,
      options=options,
      modes=modes,
    )
    rec['status'] = 'ok'
  except Exception as e:  # pylint: disable=broad-except  (recorded, the table goes on)
    rec = dict(
      mechanism=mechanism,
      projection=projection,
      length=length,
      status='failed',
      reason=f'{type(e).__name__}: {str(e).strip()[:160]}',
    )
  if not args.quiet:
    what = (
      f"params {rec['params_total']:,}, fwd {output.fmt_count(rec.get('fwd_flops'))}FLOP"
      if rec['status'] == 'ok'
      else rec['reason']
    )
    print(f'[cost] {mechanism:16s} {projection:9s} n={length:6d}  {what}', flush=True)
  return rec


def paper_params() -> List[Dict[str, Any]]:
  """Our initialised layers' parameter counts next to the paper's columns."""
  rows = []
  for dataset, heads, d, l, counts in PAPER_PARAMS:
    for projection, paper in counts.items():
      x = jax.ShapeDtypeStruct((1, l, d), jnp.float32)
      bench = attention_bench.layer_bench('softmax', projection, x, num_heads=heads)
      ours = attention_bench.count_params(bench.variables['params'])
      shown = float(f'{ours:.3g}') if dataset in ROUNDED else ours
      rows.append(
        dict(
          dataset=dataset,
          heads=heads,
          d_model=d,
          context=l,
          projection=projection,
          params=ours,
          formula=param_formula(projection, d, l),
          paper=paper,
          match=shown == paper,
        )
      )
  return rows

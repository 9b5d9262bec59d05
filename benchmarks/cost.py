r"""Cost accounting per attention layer: parameters, FLOPs and memory, measured.

For each mechanism x projection, a `MultiHeadAttention` layer at (--d_model,
--heads, --length, --batch) is initialised abstractly (`jax.eval_shape`, so
nothing is allocated) and compiled:

  * parameters: counted from the initialised parameter tree, split into the
    projection scheme's (W_Q, W_K, W_V, W_O, super's W_A) and the mechanism's own;
  * FLOPs: XLA's cost analysis of the compiled forward and forward+backward
    functions (gradient w.r.t. parameters and input), corrected for loops: XLA
    counts a while-loop body once, so for looped programs (chunked softmax,
    causal scans) the matmul FLOPs of the remaining iterations are added from
    the compiled HLO's known trip counts (see `xla_stats`);
  * memory: XLA's compiled memory analysis (arguments + outputs + temporaries).

Three tables: the layer table at the given size; each mechanism's declared
time and memory order with measured FLOP and memory scaling exponents over
--lengths; and the parameter columns of the tables of Hosseini & Hosseini
(2024), recomputed from initialised layers.

    python -m benchmarks.cost --out=benchmark_results/cost --d_model=512 --heads=8 --length=1024

Writes <out>/<name>.json, .md, <name>_flops.png (FLOPs vs length) and
<name>_params.png.
"""

import os
from typing import Any, Dict, List, Optional, Sequence

from absl import flags
import jax
import jax.numpy as jnp

from benchmarks import common
from benchmarks import output
from benchmarks import xla_stats
import efficient_attn as ea

# The per-layer "# Param." columns of Hosseini & Hosseini (2024): (dataset, heads, d_m, context l) ->
# {projection: count}; ImageNet's are printed rounded to 3 significant digits.
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


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/cost', name='cost')
  flags.DEFINE_string('mechanisms', None, 'comma list (default: all registered)', flag_values=fv)
  flags.DEFINE_string(
    'projections',
    'standard,optimised,efficient,super',
    'comma list of projection schemes',
    flag_values=fv,
  )
  flags.DEFINE_integer('d_model', 512, 'layer width', lower_bound=1, flag_values=fv)
  flags.DEFINE_integer(
    'heads', 8, 'attention heads (a divisor of --d_model)', lower_bound=1, flag_values=fv
  )
  flags.DEFINE_integer(
    'length', 1024, 'sequence length of the layer table', lower_bound=1, flag_values=fv
  )
  flags.DEFINE_integer('batch', 1, 'batch size', lower_bound=1, flag_values=fv)
  flags.DEFINE_string(
    'lengths', '256,512,1024,2048,4096', 'lengths of the complexity (scaling) table', flag_values=fv
  )
  flags.DEFINE_string(
    'scaling_projection',
    'standard',
    'projection scheme of the layers in the complexity table',
    flag_values=fv,
  )
  flags.DEFINE_multi_string('option', [], 'mechanism.option=value (repeatable)', flag_values=fv)


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
  bench = common.layer_bench(mechanism, projection, x, num_heads=heads, options=options)
  params = bench.variables.get('params', {})
  mech_params = common.count_params(params.get('mechanism', {}))
  rec = dict(
    mechanism=mechanism,
    projection=projection,
    d_model=d_model,
    heads=heads,
    length=length,
    batch=batch,
    params_total=common.count_params(params),
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
      bench = common.layer_bench('softmax', projection, x, num_heads=heads)
      ours = common.count_params(bench.variables['params'])
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


def markdown(meta, layer_rows, scaling_rows, paper_rows) -> str:
  notes = [
    f"layer table: d_model {meta['d_model']}, {meta['heads']} heads, length "
    f"{meta['length']}, batch {meta['batch']}, float32; parameters per attention layer "
    '(projection scheme + mechanism); FLOPs from XLA cost analysis of the compiled '
    'function, loop-corrected (†: the program has while loops; XLA counts their bodies '
    'once, the missing matmul FLOPs are added from known trip counts); memory from '
    "XLA's compiled memory analysis.",
    'forward+backward = gradient of sum(outputs) w.r.t. parameters and input.',
    'options: '
    + '; '.join(
      f'{m}: ' + ', '.join(f'{k}={v}' for k, v in options.items() if v is not None)
      for m, options in meta['options'].items()
    ),
  ]
  parts = [output.header('Cost per attention layer', meta['device_line'], notes)]
  dag = lambda r, mode: '†' if r.get(f'{mode}_loops') else ''
  parts += [
    f"## Per layer at d_model={meta['d_model']}, heads={meta['heads']}, length={meta['length']}",
    '',
    output.table(
      [
        'mechanism',
        'projection',
        'params',
        'of which mechanism',
        'fwd FLOPs',
        'fwd+bwd FLOPs',
        'fwd memory',
        'fwd+bwd memory',
      ],
      [
        [
          r['mechanism'],
          r['projection'],
          f"{r['params_total']:,}",
          f"{r['params_mechanism']:,}",
          output.fmt_count(r['fwd_flops']) + dag(r, 'fwd'),
          output.fmt_count(r['fwd_bwd_flops']) + dag(r, 'fwd_bwd'),
          output.fmt_bytes(r['fwd_memory_bytes']),
          output.fmt_bytes(r['fwd_bwd_memory_bytes']),
        ]
        if r['status'] == 'ok'
        else [r['mechanism'], r['projection'], r['reason']]
        for r in layer_rows
      ],
      'llrrrrrr',
    ),
    '',
  ]
  ratios = flops_ratios(layer_rows)
  if ratios:
    parts += [
      'FLOPs of the standard projection relative to the others (fwd+bwd, same '
      'mechanism): '
      + '; '.join(
        f'{m}: ' + ', '.join(f'{p} {v:.2f}x' for p, v in r.items()) for m, r in ratios.items()
      ),
      '',
    ]
  ns = meta['lengths']
  get = lambda m, n, key: next(
    (
      r.get(key)
      for r in scaling_rows
      if r['mechanism'] == m and r['length'] == n and r['status'] == 'ok'
    ),
    None,
  )
  rows = []
  for m, s in meta['scaling'].items():
    decl = ea.get_mechanism(m)
    (comp, mem), src = decl.complexity, decl.citation
    rows.append(
      [m, comp, mem, src]
      + [output.fmt_count(get(m, n, 'fwd_flops')) for n in ns]
      + [output.fmt_num(s['flops_exponent'], 3), output.fmt_num(s['memory_exponent'], 3)]
    )
  parts += [
    f"## Complexity with measured numbers: {meta['scaling_projection']} "
    f"projection, d_model={meta['d_model']}, heads={meta['heads']}",
    '',
    'Forward FLOPs per layer at each length, and fitted exponents p of FLOPs ~ n^p and '
    "XLA memory ~ n^p over those lengths (quadratic terms show as p -> 2 once they "
    'dominate; at small n the d²n projection term dominates every mechanism).',
    '',
    output.table(
      ['mechanism', 'compute (theory)', 'memory (theory)', 'source']
      + [f'FLOPs n={n}' for n in ns]
      + ['FLOPs exponent', 'memory exponent'],
      rows,
      'llll' + 'r' * (len(ns) + 2),
    ),
    '',
  ]
  parts += [
    '## Parameters per layer vs the tables of Hosseini & Hosseini (2024)',
    '',
    'Counted from initialised layers (mechanism: softmax); formula: standard 4(d²+d), '
    'optimised 3(d²+d), efficient 2(d²+d), super 2(d²+d)+l²+l. ImageNet counts are '
    'printed rounded in the paper.',
    '',
    output.table(
      ['dataset', 'h', 'd_m', 'l', 'projection', 'ours', 'formula', 'paper', 'match'],
      [
        [
          r['dataset'],
          r['heads'],
          r['d_model'],
          r['context'],
          r['projection'],
          f"{r['params']:,}",
          f"{r['formula']:,}",
          f"{r['paper']:,}",
          'yes' if r['match'] else 'NO',
        ]
        for r in paper_rows
      ],
      'lrrrlrrrl',
    ),
    '',
  ]
  return '\n'.join(parts)


def flops_ratios(rows) -> Dict[str, Dict[str, float]]:
  out = {}
  for m in dict.fromkeys(r['mechanism'] for r in rows):
    by = {
      r['projection']: r.get('fwd_bwd_flops')
      for r in rows
      if r['mechanism'] == m and r['status'] == 'ok'
    }
    if by.get('standard'):
      out[m] = {p: by['standard'] / v for p, v in by.items() if p != 'standard' and v}
  return {m: r for m, r in out.items() if r}


def plots(out, name, meta, layer_rows, scaling_rows) -> List[str]:
  ns = meta['lengths']
  series = {}
  for m in meta['scaling']:
    series[m] = (
      ns,
      [
        next(
          (
            r.get('fwd_flops')
            for r in scaling_rows
            if r['mechanism'] == m and r['length'] == n and r['status'] == 'ok'
          ),
          None,
        )
        for n in ns
      ],
    )
  mem = {
    m: (
      ns,
      [
        next(
          (
            r.get('fwd_memory_bytes')
            for r in scaling_rows
            if r['mechanism'] == m and r['length'] == n and r['status'] == 'ok'
          ),
          None,
        )
        for n in ns
      ],
    )
    for m in meta['scaling']
  }
  paths = [
    output.line_plot(
      os.path.join(out, f'{name}_flops.png'),
      [('forward FLOPs per layer', series), ('forward memory per layer (XLA, bytes)', mem)],
      xlabel='sequence length (tokens)',
      ylabel='FLOPs / bytes',
      suptitle=(
        f"{meta['scaling_projection']} projection, d_model={meta['d_model']}, "
        f"heads={meta['heads']}; {meta['device_line']}"
      ),
    )
  ]
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  ok = [r for r in layer_rows if r['status'] == 'ok']
  projections = list(dict.fromkeys(r['projection'] for r in ok))
  mechanisms = list(dict.fromkeys(r['mechanism'] for r in ok))
  fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(mechanisms) * len(projections) / 2), 4))
  width = 0.8 / max(1, len(projections))
  for i, p in enumerate(projections):
    ys = [
      next((r['params_total'] for r in ok if r['mechanism'] == m and r['projection'] == p), 0)
      for m in mechanisms
    ]
    ax.bar([j + i * width for j in range(len(mechanisms))], ys, width, label=p)
  ax.set_xticks(
    [j + width * (len(projections) - 1) / 2 for j in range(len(mechanisms))],
    mechanisms,
    rotation=30,
    ha='right',
  )
  ax.set_ylabel('parameters per attention layer')
  ax.set_title(
    f"Parameters per layer, d_model={meta['d_model']}, heads={meta['heads']}, "
    f"length={meta['length']}",
    fontsize=10,
  )
  ax.legend(fontsize=8)
  return paths + [output.save_figure(fig, os.path.join(out, f'{name}_params.png'))]


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = common.parse_flags(define_flags, argv, __doc__)
  info = common.device_info()
  with common.flag_errors():  # a bad value stops here, not as a table of failed rows
    if args.d_model % args.heads:
      divisors = [h for h in range(1, args.d_model + 1) if args.d_model % h == 0]
      raise ValueError(
        f'--heads={args.heads} does not divide --d_model={args.d_model}; '
        f'valid --heads: {", ".join(map(str, divisors))}'
      )
    mechanisms = (
      common.csv_list(args.mechanisms) if args.mechanisms else list(common.available_mechanisms())
    )
    projections = common.csv_list(args.projections)
    for t in [f'{m}/{p}' for m in mechanisms for p in projections + [args.scaling_projection]]:
      common.parse_target(t)
    overrides = common.parse_options(args.option)
    options = {m: common.effective_options(m, overrides.get(m)) for m in mechanisms}
    lengths = common.csv_list(args.lengths, int, '--lengths')

  layer_rows = [
    safe_cost(args, m, p, args.length, overrides.get(m, {}), ('fwd', 'fwd_bwd'))
    for m in mechanisms
    for p in projections
  ]
  scaling_rows = [
    safe_cost(args, m, args.scaling_projection, n, overrides.get(m, {}), ('fwd',))
    for m in mechanisms
    for n in lengths
  ]
  scaling = {}
  for m in mechanisms:
    ok = [r for r in scaling_rows if r['mechanism'] == m and r['status'] == 'ok']
    scaling[m] = dict(
      flops_exponent=common.fit_exponent([r['length'] for r in ok], [r['fwd_flops'] for r in ok]),
      memory_exponent=common.fit_exponent(
        [r['length'] for r in ok], [r['fwd_memory_bytes'] for r in ok]
      ),
    )
  paper_rows = paper_params()
  meta = dict(
    device=info,
    device_line=common.describe_device(info),
    d_model=args.d_model,
    heads=args.heads,
    length=args.length,
    batch=args.batch,
    lengths=lengths,
    scaling_projection=args.scaling_projection,
    options=options,
    scaling=scaling,
    command=output.command('benchmarks.cost', argv),
  )
  pngs = plots(args.out, args.name, meta, layer_rows, scaling_rows)
  data = dict(
    meta=meta, layers=layer_rows, scaling=scaling_rows, paper_params=paper_rows, plots=pngs
  )
  output.finish(
    args.out,
    args.name,
    data,
    markdown(meta, layer_rows, scaling_rows, paper_rows),
    quiet=args.quiet,
  )
  return data


if __name__ == '__main__':
  main()

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

from typing import Any, Dict, Optional, Sequence

from absl import flags

from benchmarks import attention_bench
from benchmarks import common
from benchmarks import cost_layers
from benchmarks import cost_output
from benchmarks import machine
from benchmarks import output
from benchmarks import timing


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


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = common.parse_flags(define_flags, argv, __doc__)
  info = machine.device_info()
  with common.flag_errors():  # a bad value stops here, not as a table of failed rows
    if args.d_model % args.heads:
      divisors = [h for h in range(1, args.d_model + 1) if args.d_model % h == 0]
      raise ValueError(
        f'--heads={args.heads} does not divide --d_model={args.d_model}; '
        f'valid --heads: {", ".join(map(str, divisors))}'
      )
    mechanisms = (
      common.csv_list(args.mechanisms)
      if args.mechanisms
      else list(attention_bench.available_mechanisms())
    )
    projections = common.csv_list(args.projections)
    for t in [f'{m}/{p}' for m in mechanisms for p in projections + [args.scaling_projection]]:
      attention_bench.parse_target(t)
    overrides = common.parse_options(args.option)
    options = {m: attention_bench.effective_options(m, overrides.get(m)) for m in mechanisms}
    lengths = common.csv_list(args.lengths, int, '--lengths')

  layer_rows = [
    cost_layers.safe_cost(args, m, p, args.length, overrides.get(m, {}), ('fwd', 'fwd_bwd'))
    for m in mechanisms
    for p in projections
  ]
  scaling_rows = [
    cost_layers.safe_cost(args, m, args.scaling_projection, n, overrides.get(m, {}), ('fwd',))
    for m in mechanisms
    for n in lengths
  ]
  scaling = {}
  for m in mechanisms:
    ok = [r for r in scaling_rows if r['mechanism'] == m and r['status'] == 'ok']
    scaling[m] = dict(
      flops_exponent=timing.fit_exponent([r['length'] for r in ok], [r['fwd_flops'] for r in ok]),
      memory_exponent=timing.fit_exponent(
        [r['length'] for r in ok], [r['fwd_memory_bytes'] for r in ok]
      ),
    )
  paper_rows = cost_layers.paper_params()
  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
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
  pngs = cost_output.write_plots(args.out, args.name, meta, layer_rows, scaling_rows)
  data = dict(
    meta=meta, layers=layer_rows, scaling=scaling_rows, paper_params=paper_rows, plots=pngs
  )
  output.finish(
    args.out,
    args.name,
    data,
    cost_output.markdown(meta, layer_rows, scaling_rows, paper_rows),
    quiet=args.quiet,
  )
  return data


if __name__ == '__main__':
  main()

r"""Linen layer vs NNX layer: forward + backward time with the same parameters.

    python -m benchmarks.nnx_overhead --out=docs/results --name=nnx_overhead

For each mechanism, `efficient_attn.MultiHeadAttention` (Linen, `jax.jit` of
`jax.grad`) and `efficient_attn.nnx.MultiHeadAttention` get the gradient of
sum(output) with respect to every parameter and the input. The NNX layer runs
twice: under `nnx.jit` / `nnx.grad` (NNX's own per-call work counted) and as
`nnx.split` state under `jax.jit`. For softmax with the standard projection,
flax's own `nn.MultiHeadDotProductAttention` runs beside them with the same
parameters. The calls are interleaved in one process and the medians compared.
Writes <out>/<name>.json and .md.
"""

import statistics
import time
from typing import Any, Dict, List, Optional, Sequence

from flax import nnx
import flax.linen as nn
import jax

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import timing
import efficient_attn as ea
import efficient_attn.nnx as ean


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_list('mechanisms', ['softmax', 'linear', 'performer'], 'mechanisms', flag_values=fv)
  flags.DEFINE_string('projection', 'standard', 'projection scheme', flag_values=fv)
  flags.DEFINE_integer('batch', 32, 'batch size', flag_values=fv)
  flags.DEFINE_integer('length', 256, 'sequence length', flag_values=fv)
  flags.DEFINE_integer('d_model', 256, 'model width', flag_values=fv)
  flags.DEFINE_integer('heads', 8, 'heads', flag_values=fv)
  flags.DEFINE_integer(
    'repeats', 15, 'timed calls of each layer (interleaved)', lower_bound=1, flag_values=fv
  )
  common.define_output_flags(fv, out='benchmark_results', name='nnx_overhead', quiet=False)


def measure(
  mechanism: str,
  *,
  projection: str,
  batch: int,
  length: int,
  d_model: int,
  heads: int,
  repeats: int,
) -> Dict[str, Any]:
  """Median fwd+bwd seconds of both layers, interleaved, with the same parameters."""
  kw = dict(mechanism=mechanism, projection=projection, max_length=length)
  x = jax.random.normal(jax.random.PRNGKey(0), (batch, length, d_model))
  layer = ean.MultiHeadAttention(heads, d_model, rngs=nnx.Rngs(0), **kw)
  linen = ea.MultiHeadAttention(num_heads=heads, **kw)
  params = ean.to_linen_params(layer)

  linen_step = jax.jit(jax.grad(lambda p, x: linen.apply({'params': p}, x).sum(), argnums=(0, 1)))
  nnx_step = nnx.jit(nnx.grad(lambda m, x: m(x).sum(), argnums=(0, 1)))
  graphdef, state = nnx.split(layer)
  pure_step = jax.jit(jax.grad(lambda st, x: nnx.merge(graphdef, st)(x).sum(), argnums=(0, 1)))
  calls = {
    'linen': lambda: linen_step(params, x),
    'nnx': lambda: nnx_step(layer, x),
    'nnx_split': lambda: pure_step(state, x),
  }
  if mechanism == 'softmax' and projection == 'standard':  # the same parameter tree
    flax_layer = nn.MultiHeadDotProductAttention(num_heads=heads)
    flax_step = jax.jit(
      jax.grad(lambda p, x: flax_layer.apply({'params': p}, x).sum(), argnums=(0, 1))
    )
    calls['flax'] = lambda: flax_step(params, x)
  times: Dict[str, List[float]] = {name: [] for name in calls}
  for call in calls.values():  # compile and warm up
    timing.block(call())
  for _ in range(repeats):
    for name, call in calls.items():
      start = time.perf_counter()
      timing.block(call())
      times[name].append(time.perf_counter() - start)
  linen_s, nnx_s, split_s = (statistics.median(times[n]) for n in ('linen', 'nnx', 'nnx_split'))
  flax_s = statistics.median(times['flax']) if 'flax' in times else None
  return dict(
    mechanism=mechanism,
    projection=projection,
    linen_s=linen_s,
    nnx_s=nnx_s,
    nnx_split_s=split_s,
    ratio=nnx_s / linen_s,
    split_ratio=split_s / linen_s,
    flax_s=flax_s,
    flax_ratio=linen_s / flax_s if flax_s else None,
    runs=repeats,
    times_s=times,
  )


def main(argv: Optional[Sequence[str]] = None) -> None:
  fv = common.parse_flags(define_flags, argv, __doc__)
  shape = dict(batch=fv.batch, length=fv.length, d_model=fv.d_model, heads=fv.heads)
  rows = [measure(m, projection=fv.projection, repeats=fv.repeats, **shape) for m in fv.mechanisms]
  info = machine.device_info()
  device = machine.describe_device(info)
  notes = [
    f'forward + backward (gradient of sum(output) w.r.t. parameters and input), batch '
    f'{fv.batch}, length {fv.length}, d_model {fv.d_model}, {fv.heads} heads, float32, '
    f'{fv.projection} projection; median of {fv.repeats} interleaved calls each.',
    "NNX: `nnx.jit`, which includes its own per-call work (walking the module graph); "
    'NNX split: the same layer as `nnx.split` state under `jax.jit` (no per-call '
    'graph work), the pattern flax recommends for hot loops.',
    "flax: flax's own `nn.MultiHeadDotProductAttention` with the same parameters "
    '(softmax, standard projection only).',
  ]
  table = output.table(
    [
      'mechanism',
      'Linen',
      'NNX',
      'NNX / Linen',
      'NNX split',
      'NNX split / Linen',
      'flax',
      'Linen / flax',
    ],
    [
      [
        r['mechanism'],
        output.fmt_time(r['linen_s']),
        output.fmt_time(r['nnx_s']),
        f'{r["ratio"]:.3f}',
        output.fmt_time(r['nnx_split_s']),
        f'{r["split_ratio"]:.3f}',
        output.fmt_time(r['flax_s']) if r['flax_s'] else '',
        f'{r["flax_ratio"]:.3f}' if r['flax_ratio'] else '',
      ]
      for r in rows
    ],
  )
  markdown = '\n'.join([output.header('NNX layer overhead', device, notes), table, ''])
  output.finish(fv.out, fv.name, dict(device=info, shape=shape, rows=rows), markdown)


if __name__ == '__main__':
  main()

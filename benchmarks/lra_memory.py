r"""Where the LRA Text model's training memory goes, per mechanism (XLA's memory analysis).

    python -m benchmarks.lra_memory --out=docs/results --name=lra_memory

`benchmarks.lra_efficiency` gives each mechanism's train-step memory relative to
softmax's. This splits it, at one length (--length, 4096) and batch (--batch_size,
2, that table's), for LRA's Text model (`configs/lra/text.py`, size base: 4
layers, width 256, 4 heads, MLP 1024, every mechanism at its declared defaults):

  step        the compiled train step's memory (arguments + outputs + temporaries
              - aliased), as in lra_efficiency;
  state       parameters and optimiser state (AdamW: two moments);
  per layer   (step at the config's depth - step at depth 1) / (depth - 1): what
              one more encoder block adds (its attention, MLP, norms, dropout);
  fixed       step at depth 1 - per layer: embeddings, positions, pooling and
              head, state, batch;
  attention   one attention layer (the mechanism with the standard projection,
              d_model -> heads x head_dim and back) compiled alone, forward +
              backward at the same shapes, without attention dropout (the step drops
              softmax's weights at LRA's 0.1); its share of the step is depth x this
              / step (an estimate: alone, its input gradient is a buffer of its own);
  floor       step - depth x attention: the memory the rest of the model needs
              whatever the mechanism; floor / softmax's step bounds the ratio any
              mechanism can reach in this model.

No step runs: compiling is enough (XLA's analysis). Writes <out>/<name>.json and .md.
"""

import sys
from typing import Any, Dict, Optional, Sequence

import jax

from benchmarks import attention_bench
from benchmarks import common
from benchmarks import lra_efficiency
from benchmarks import machine
from benchmarks import output
from benchmarks import train_speed
from benchmarks import xla_stats
import efficient_attn as ea


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_list(
    'mechanisms',
    ['softmax', 'linear', 'performer', 'linformer', 'local'],
    'mechanisms (the first is the baseline of the ratios)',
    flag_values=fv,
  )
  flags.DEFINE_integer('length', 4096, 'sequence length', flag_values=fv)
  flags.DEFINE_integer('batch_size', 2, 'batch', flag_values=fv)
  flags.DEFINE_string(
    'size', 'base', "configs/lra/text.py size ('base' = LRA's model)", flag_values=fv
  )
  common.define_output_flags(fv, out='benchmark_results', name='lra_memory')


def step_memory(
  mechanism: str, length: int, size: str, batch_size: int, depth: Optional[int] = None
) -> Dict[str, int]:
  """{step, state} bytes of the config's train step (at `depth` blocks if given)."""
  config = lra_efficiency.text_config(mechanism, length, size, batch_size)
  if depth is not None:
    config.model.depth = depth
  compiled, state, _, _ = train_speed.compiled_train_step(
    config, train_speed.synthetic_batch(config, batch_size)
  )
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, 'nbytes'))
  return dict(
    step=xla_stats.memory(compiled)['total'],
    state=state_bytes,
    depth=config.model.depth,
    d_model=config.model.d_model,
    heads=config.model.num_heads,
    options={
      option.name: config.attention.options.get(option.name)
      for option in ea.get_mechanism(mechanism).options
      if config.attention.options.get(option.name) is not None
    },
  )


def attention_memory(
  mechanism: str, length: int, batch_size: int, d_model: int, heads: int, options
) -> int:
  """Forward + backward memory of one attention layer alone (standard projection)."""
  x = jax.ShapeDtypeStruct((batch_size, length, d_model), jax.numpy.float32)
  bench = attention_bench.layer_bench(mechanism, 'standard', x, num_heads=heads, options=options)
  fn, args = bench.forward_backward()
  return xla_stats.memory(jax.jit(fn).lower(*args).compile())['total']


def measure(mechanism: str, fv) -> Dict[str, Any]:
  full = step_memory(mechanism, fv.length, fv.size, fv.batch_size)
  one = step_memory(mechanism, fv.length, fv.size, fv.batch_size, depth=1)
  depth = full['depth']
  if depth < 2:
    raise ValueError(f'--size={fv.size} has depth {depth}; the split needs at least 2 blocks')
  per_layer = (full['step'] - one['step']) / (depth - 1)
  attention = attention_memory(
    mechanism, fv.length, fv.batch_size, full['d_model'], full['heads'], full['options']
  )
  return dict(
    mechanism=mechanism,
    depth=depth,
    step=full['step'],
    state=full['state'],
    per_layer=per_layer,
    fixed=one['step'] - per_layer,
    attention=attention,
    attention_share=depth * attention / full['step'],
    floor=full['step'] - depth * attention,
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  fv = common.parse_flags(define_flags, argv, __doc__)
  rows = []
  for mechanism in fv.mechanisms:
    rows.append(measure(mechanism, fv))
    if not fv.quiet:
      print(f"{mechanism}: step {output.fmt_bytes(rows[-1]['step'])}", flush=True)
  base = rows[0]['step']
  fmt = output.fmt_bytes
  table = output.table(
    [
      'mechanism',
      'step',
      f'vs {rows[0]["mechanism"]}',
      'state',
      'fixed',
      'per layer',
      'attention layer',
      'attention share',
      'floor',
      f'floor / {rows[0]["mechanism"]}',
    ],
    [
      [
        r['mechanism'],
        fmt(r['step']),
        f"{r['step'] / base:.2f}x",
        fmt(r['state']),
        fmt(r['fixed']),
        fmt(r['per_layer']),
        fmt(r['attention']),
        f"{100 * r['attention_share']:.0f}%",
        fmt(r['floor']),
        f"{r['floor'] / base:.2f}x",
      ]
      for r in rows
    ],
  )
  notes = [
    f"LRA's Text model (configs/lra/text.py, size={fv.size}, depth {rows[0]['depth']}), "
    f'{fv.length} tokens, batch {fv.batch_size}; XLA\'s compiled memory analysis, '
    'nothing run.',
    'state: parameters + optimiser state; fixed: the step at depth 1 less one layer; '
    'per layer: what each further block adds; attention layer: one layer (standard '
    'projection) alone, forward + backward; attention share: depth x that / step; '
    'floor: step - depth x attention layer.',
    'command: python -m benchmarks.lra_memory ' + ' '.join(sys.argv[1:] if argv is None else argv),
  ]
  data = dict(device=machine.device_info(), flags={f: fv[f].value for f in fv}, rows=rows)
  output.finish_table(
    fv.out,
    fv.name,
    "Where LRA Text's training memory goes",
    machine.describe_device(data['device']),
    notes,
    table,
    data,
    quiet=fv.quiet,
  )
  return data


if __name__ == '__main__':
  main()

r"""Approximation error of attention mechanisms against exact softmax attention.

error = ||out - ref||_F / ||ref||_F over the whole `[batch, length, heads, dim]`
output, where ref is the exact attention the mechanism declares it
approximates (`registry.Mechanism.reference`): softmax(q k^T / sqrt(d)) v on the
same q, k, v for most; softmax over cosine similarities for RFA (what its
features estimate); shared-query-key softmax for Reformer. Linear attention
(elu+1, relu, identity) is not an estimator of softmax; its numbers say how far
the kernel is from it. (Its 'taylor' map, a second-order expansion of softmax's exp,
is not in the knob sweep.)

Four sweeps:
  * knob: each mechanism's knob (random features, landmarks, projected length
    k, window, ...) at --knob_length, on random q, k ~ N(0, qk_scale^2), v ~
    N(0, 1) (mean and std over --seeds draws of inputs and of the mechanism's
    randomness/parameters); N(0, 1) is what a freshly initialised layer's
    projections of layer-normed inputs produce;
  * length: each mechanism at its default options over --lengths;
  * scale: each mechanism at its default options against the std of q and k
    (--scales): random-feature estimators degrade quickly as |q|, |k| grow;
  * checkpoint: the knob sweep on the q, k, v that trained models (--source:
    workdirs, or 'random:<mechanism>' for an untrained ViT) compute on a batch
    of their eval inputs, per attention layer and averaged over layers.
Plus identity checks: settings where the mechanism must equal exact attention.

Parameterised mechanisms are used at their initialisation: Linformer's E, F
are learned, so at init (Xavier-uniform) it is not meant to approximate softmax.

    python -m benchmarks.approx_error --out=benchmark_results/error
    python -m benchmarks.approx_error --source=runs/digits_softmax --knob_length=512

Writes <out>/<name>.json, .md, <name>_knob.png, <name>_length.png,
<name>_scale.png and, with sources, <name>_checkpoint.png.
"""

import os
from typing import Any, Dict, Optional, Sequence

from absl import flags

from benchmarks import approx_error_output
from benchmarks import approx_error_sweeps
from benchmarks import attention_bench
from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import runs
import efficient_attn as ea


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/approx_error', name='approx_error')
  flags.DEFINE_string(
    'mechanisms',
    None,
    'comma list (default: every registered mechanism except softmax)',
    flag_values=fv,
  )
  flags.DEFINE_multi_string(
    'knob',
    [],
    "mechanism.option=v1,v2,... replaces that mechanism's sweep "
    "('n' = length, '2n' = twice it; repeatable)",
    flag_values=fv,
  )
  flags.DEFINE_integer('knob_length', 1024, 'sequence length of the knob sweep', flag_values=fv)
  flags.DEFINE_string(
    'lengths',
    '128,256,512,1024,2048,4096',
    'comma list of lengths of the length sweep',
    flag_values=fv,
  )
  flags.DEFINE_integer('batch', 1, 'batch size', flag_values=fv)
  flags.DEFINE_integer('heads', 8, 'attention heads', flag_values=fv)
  flags.DEFINE_integer('head_dim', 64, 'dimension per head', flag_values=fv)
  flags.DEFINE_integer('seeds', 3, 'random draws per point', flag_values=fv)
  flags.DEFINE_float(
    'qk_scale', 1.0, 'std of the random q, k entries (v is N(0, 1))', flag_values=fv
  )
  flags.DEFINE_string(
    'scales',
    '0.25,0.5,1,2',
    'q, k scales of the scale sweep at --knob_length (default options)',
    flag_values=fv,
  )
  flags.DEFINE_multi_string(
    'source',
    [],
    "workdir or 'random:<mechanism>' whose captured q, k, v to use (repeatable)",
    flag_values=fv,
  )
  flags.DEFINE_integer('num_examples', 8, 'eval examples per source', flag_values=fv)
  flags.DEFINE_multi_string(
    'option', [], 'mechanism.option=value applied to every point (repeatable)', flag_values=fv
  )
  flags.DEFINE_bool('no_identities', False, 'skip the identity checks', flag_values=fv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = common.parse_flags(define_flags, argv, __doc__)
  info = machine.device_info()
  with common.flag_errors():
    mechanisms = (
      common.csv_list(args.mechanisms)
      if args.mechanisms
      else [m for m in attention_bench.available_mechanisms() if m != 'softmax']
    )
    for m in mechanisms:
      try:
        ea.get_mechanism(m)
      except ValueError as e:
        raise ValueError(f'--mechanisms: {e}') from None
    knobs = {
      m: (d.knob[0], list(d.knob[1]))
      for m, d in ((m, ea.get_mechanism(m)) for m in mechanisms)
      if d.knob is not None
    }
    for item in args.knob:
      key, _, values = item.partition('=')
      m, _, option = key.partition('.')
      if not option or not values:
        raise ValueError(f'--knob {item!r} must look like mechanism.option=v1,v2')
      if m not in mechanisms:
        raise ValueError(
          f'--knob {item!r}: {m!r} is not one of the mechanisms measured ({", ".join(mechanisms)})'
        )
      knobs[m] = (option, [common.parse_value(v) for v in common.csv_list(values)])
    fixed = common.parse_options(args.option)
    options = {m: attention_bench.effective_options(m, fixed.get(m)) for m in mechanisms}
    lengths = common.csv_list(args.lengths, int, '--lengths')
    scales = common.csv_list(args.scales, float, '--scales')
    sources = [runs.load_source(name, args.num_examples) for name in args.source]

  inputs = {
    f'random, n={args.knob_length}': (
      args.knob_length,
      approx_error_sweeps.random_draws(args, args.knob_length),
    )
  }
  checkpoint_inputs = {}
  for name, source in zip(args.source, sources):
    layers = runs.capture_qkv(source)
    length = layers[0][1][1].shape[1]
    checkpoint_inputs[f'{name} (captured q,k,v)'] = (
      length,
      {layer: [(0, qkv)] for layer, qkv in layers},
    )
  knob_rows = approx_error_sweeps.knob_sweep(args, mechanisms, knobs, fixed, inputs)
  ckpt_rows = approx_error_sweeps.knob_sweep(args, mechanisms, knobs, fixed, checkpoint_inputs)
  length_rows = approx_error_sweeps.length_sweep(args, mechanisms, fixed, lengths)
  scale_rows = approx_error_sweeps.scale_sweep(args, mechanisms, fixed, scales)
  identity_rows = (
    [] if args.no_identities else approx_error_sweeps.identity_checks(args, mechanisms)
  )

  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
    batch=args.batch,
    heads=args.heads,
    head_dim=args.head_dim,
    seeds=args.seeds,
    qk_scale=args.qk_scale,
    knob_length=args.knob_length,
    knobs={m: list(v) for m, v in knobs.items()},
    options=options,
    sources=args.source,
    command=output.command('benchmarks.approx_error', argv),
  )
  sub = machine.describe_device(info)
  plots = [
    p
    for p in (
      approx_error_output.knob_plot(
        os.path.join(args.out, f'{args.name}_knob.png'),
        knob_rows,
        f'Relative error vs knob, random inputs; {sub}',
      ),
      approx_error_output.sweep_plot(
        os.path.join(args.out, f'{args.name}_length.png'),
        length_rows,
        'length',
        'sequence length (tokens)',
        f'Relative error vs length, random inputs, default options; {sub}',
      ),
      approx_error_output.sweep_plot(
        os.path.join(args.out, f'{args.name}_scale.png'),
        scale_rows,
        'qk_scale',
        'std of q and k entries',
        f'Relative error vs q, k scale, n={args.knob_length}, default options; {sub}',
      ),
      approx_error_output.knob_plot(
        os.path.join(args.out, f'{args.name}_checkpoint.png'),
        ckpt_rows,
        f'Relative error vs knob on captured q, k, v (mean over layers); {sub}',
      )
      if ckpt_rows
      else None,
    )
    if p
  ]
  data = dict(
    meta=meta,
    knob=knob_rows + ckpt_rows,
    length=length_rows,
    scale=scale_rows,
    identity=identity_rows,
    plots=plots,
  )
  output.finish(
    args.out,
    args.name,
    data,
    approx_error_output.markdown(
      meta, knob_rows + ckpt_rows, length_rows, scale_rows, identity_rows
    ),
    quiet=args.quiet,
  )
  return data


if __name__ == '__main__':
  main()

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

import functools
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import flags
import jax
import numpy as np

from benchmarks import common
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


# ----------------------------------------------------------------------------
# The math.
# ----------------------------------------------------------------------------


def relative_error(out, ref) -> float:
  """||out - ref||_F / ||ref||_F in float64."""
  out = np.asarray(out, np.float64)
  ref = np.asarray(ref, np.float64)
  return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def reference(mechanism: str, options: Dict[str, Any], q, k, v):
  """The exact attention `mechanism` approximates (its declaration's `reference`)."""
  decl = ea.get_mechanism(mechanism)
  return decl.reference(decl.resolve(options), q, k, v)


def resolve(value: Any, length: int) -> Any:
  """'n' -> length, '2n' -> 2 length; other values unchanged."""
  if value == 'n':
    return length
  if value == '2n':
    return 2 * length
  return value


@functools.lru_cache(maxsize=64)
def _compiled(mechanism: str, options: Tuple[Tuple[str, Any], ...], length: int):
  """(jitted init_with_output, jitted apply) of a mechanism, reused across draws."""
  module = common.build_mechanism(mechanism, length, dict(options))
  return jax.jit(module.init_with_output), jax.jit(module.apply)


def mechanism_output(mechanism: str, options: Dict[str, Any], q, k, v, seed: int):
  """Output of the mechanism's Linen module initialised from `seed` (jitted).

  Random-feature mechanisms also draw their features from `seed`.
  """
  options = dict(options)
  if ea.get_mechanism(mechanism).random_features:
    options.setdefault('seed', seed)
  init, _ = _compiled(mechanism, tuple(sorted(options.items())), k.shape[1])
  out, _ = init(jax.random.PRNGKey(seed), q, k, v)
  return out


def point_error(mechanism: str, options: Dict[str, Any], qkv_draws) -> Tuple[float, float]:
  """(mean, std) relative error over draws [(seed, (q, k, v))]."""
  errors = []
  for seed, (q, k, v) in qkv_draws:
    n = k.shape[1]
    opts = {key: resolve(val, n) for key, val in options.items()}
    out = mechanism_output(mechanism, opts, q, k, v, seed)
    errors.append(relative_error(out, reference(mechanism, opts, q, k, v)))
  return float(np.mean(errors)), float(np.std(errors))


# ----------------------------------------------------------------------------
# Sweeps.
# ----------------------------------------------------------------------------


def random_draws(args, length: int, qk_scale: Optional[float] = None):
  """[(seed, (q, k, v))]: v ~ N(0, 1), q and k ~ N(0, qk_scale^2) (default --qk_scale)."""
  scale = args.qk_scale if qk_scale is None else qk_scale
  draws = []
  for s in range(args.seeds):
    q, k, v = common.random_qkv(1000 * s + length, args.batch, length, args.heads, args.head_dim)
    draws.append((s, (q * scale, k * scale, v)))
  return draws


# Knobs that stop mattering past a multiple of the length (landmarks, projected
# length and chunks are clamped to n; a window of 2n already covers every key).
LENGTH_BOUNDED = {'num_landmarks': 1, 'k_proj': 1, 'k_chunk': 1, 'q_chunk': 1, 'window': 2}


def knob_values(option: str, values: Sequence[Any], length: int) -> List[Any]:
  """The sweep's values that differ at `length`: bounded knobs above their bound
  dropped (the symbolic 'n' / '2n' kept), duplicates after resolving dropped."""
  keep, seen = [], set()
  bound = LENGTH_BOUNDED.get(option)
  for v in values:
    r = resolve(v, length)
    if bound and isinstance(v, (int, float)) and not isinstance(v, bool) and r > bound * length:
      continue
    if r in seen:
      continue
    seen.add(r)
    keep.append(v)
  return keep


def progress(args, text: str):
  if not args.quiet:
    print(text, flush=True)


def knob_sweep(args, mechanisms, knobs, fixed, draws_by_name) -> List[Dict[str, Any]]:
  """Rows over knobs for each input set {name: (length, [(seed, qkv) or per-layer])}."""
  rows = []
  for inputs_name, (length, draws) in draws_by_name.items():
    for m in mechanisms:
      if m not in knobs:
        continue
      option, values = knobs[m]
      for value in knob_values(option, values, length):
        opts = dict(fixed.get(m, {}), **{option: value})
        row = dict(
          inputs=inputs_name,
          mechanism=m,
          option=option,
          value=value,
          resolved=resolve(value, length),
          length=length,
        )
        try:
          if isinstance(draws, dict):  # checkpoint: per layer
            per_layer = {name: point_error(m, opts, d)[0] for name, d in draws.items()}
            row.update(
              error=float(np.mean(list(per_layer.values()))),
              std=float(np.std(list(per_layer.values()))),
              per_layer=per_layer,
            )
          else:
            row['error'], row['std'] = point_error(m, opts, draws)
        except Exception as e:  # pylint: disable=broad-except  (recorded, sweep continues)
          row.update(error=None, std=None, reason=f'{type(e).__name__}: {str(e)[:160]}')
        rows.append(row)
        progress(
          args,
          f'[knob] {inputs_name:28s} {m:16s} {option}={value!s:8s} '
          f'error {output.fmt_num(row["error"], 3)}',
        )
  return rows


def length_sweep(args, mechanisms, fixed, lengths) -> List[Dict[str, Any]]:
  rows = []
  for n in lengths:
    draws = random_draws(args, n)
    for m in mechanisms:
      row = dict(mechanism=m, length=n, options=fixed.get(m, {}))
      try:
        row['error'], row['std'] = point_error(m, fixed.get(m, {}), draws)
      except Exception as e:  # pylint: disable=broad-except
        row.update(error=None, std=None, reason=f'{type(e).__name__}: {str(e)[:160]}')
      rows.append(row)
      progress(args, f'[length] {m:16s} n={n:6d} error {output.fmt_num(row["error"], 3)}')
  return rows


def scale_sweep(args, mechanisms, fixed, scales) -> List[Dict[str, Any]]:
  """Error against the scale of q and k (logits q.k / sqrt(d) have std scale^2)."""
  rows = []
  for scale in scales:
    draws = random_draws(args, args.knob_length, scale)
    for m in mechanisms:
      row = dict(mechanism=m, qk_scale=scale, length=args.knob_length)
      try:
        row['error'], row['std'] = point_error(m, fixed.get(m, {}), draws)
      except Exception as e:  # pylint: disable=broad-except
        row.update(error=None, std=None, reason=f'{type(e).__name__}: {str(e)[:160]}')
      rows.append(row)
      progress(
        args, f'[scale] {m:16s} qk_scale={scale:<5g} error {output.fmt_num(row["error"], 3)}'
      )
  return rows


def identity_checks(args, mechanisms) -> List[Dict[str, Any]]:
  n = min(args.knob_length, 256)
  draws = random_draws(args, n)[:1]
  rows = []
  for m in mechanisms:
    opts = ea.get_mechanism(m).exact_options(n)
    if opts is None:
      continue
    label = f'{m}, ' + ', '.join(f'{k}={v}' for k, v in opts.items())
    err, _ = point_error(m, opts, draws)
    rows.append(dict(check=label, mechanism=m, options=opts, length=n, error=err))
    progress(args, f'[identity] {label:55s} n={n} error {err:.3g}')
  return rows


# ----------------------------------------------------------------------------
# Output.
# ----------------------------------------------------------------------------


def sweep_table(rows, key: str) -> str:
  xs = sorted({r[key] for r in rows})
  mechs = list(dict.fromkeys(r['mechanism'] for r in rows))
  get = lambda m, x: next((r['error'] for r in rows if r['mechanism'] == m and r[key] == x), None)
  return output.table(
    ['mechanism'] + [f'{x:g}' for x in xs],
    [[m] + [output.fmt_num(get(m, x), 3) for x in xs] for m in mechs],
  )


def markdown(meta, knob_rows, length_rows, scale_rows, identity_rows) -> str:
  notes = [
    'error = ||out - exact||_F / ||exact||_F; exact = softmax(q k^T / sqrt(d)) v on the same '
    'q, k, v (RFA: softmax over cosine similarities / sigma^2, what it estimates).',
    f"random inputs: q, k ~ N(0, {meta['qk_scale']:g}²), v ~ N(0, 1), batch {meta['batch']}, "
    f"{meta['heads']} heads, "
    f"head_dim {meta['head_dim']}; mean ± std over {meta['seeds']} draws of inputs and of "
    'random features / initial parameters.',
    'parameterised mechanisms at initialisation (Linformer E, F learned: not an '
    'approximation at init); linear attention is a different kernel, not an estimator.',
    'default options: '
    + '; '.join(
      f'{m}: ' + ', '.join(f'{k}={v}' for k, v in options.items() if v is not None)
      for m, options in meta['options'].items()
    ),
  ]
  parts = [
    output.header('Approximation error vs exact softmax attention', meta['device_line'], notes)
  ]
  for inputs_name in dict.fromkeys(r['inputs'] for r in knob_rows):
    rows = [r for r in knob_rows if r['inputs'] == inputs_name]
    spread = '± std over layers' if 'captured' in inputs_name else '± std over draws'
    parts += [
      f'## Error vs knob: {inputs_name} (length {rows[0]["length"]})',
      '',
      output.table(
        ['mechanism', 'knob', 'value', 'relative error', spread],
        [
          [
            r['mechanism'],
            r['option'],
            r['resolved'],
            output.fmt_num(r['error'], 3),
            output.fmt_num(r['std'], 2),
          ]
          for r in rows
        ],
        'lllrr',
      ),
      '',
    ]
  if length_rows:
    parts += [
      '## Error vs length (random inputs, default options)',
      '',
      sweep_table(length_rows, 'length'),
      '',
    ]
  if scale_rows:
    parts += [
      f"## Error vs std of q and k entries (n={meta['knob_length']}, default options)",
      '',
      'Logits q.k / sqrt(d) have std scale²; FAVOR+ variance grows like '
      'exp(|q|² / sqrt(d) + |k|² / sqrt(d)).',
      '',
      sweep_table(scale_rows, 'qk_scale'),
      '',
    ]
  if identity_rows:
    parts += [
      '## Identity checks (must be ~0)',
      '',
      output.table(
        ['setting', 'length', 'relative error'],
        [[r['check'], r['length'], f"{r['error']:.2e}"] for r in identity_rows],
        'lrr',
      ),
      '',
    ]
  return '\n'.join(parts)


def knob_plot(path: str, rows, title: str) -> Optional[str]:
  """A panel per mechanism with a numeric knob: error against the knob, a line per input set."""
  numeric = lambda m: all(
    isinstance(r['resolved'], (int, float)) for r in rows if r['mechanism'] == m
  )
  panels = []
  for m in [m for m in dict.fromkeys(r['mechanism'] for r in rows) if numeric(m)]:
    mine = [r for r in rows if r['mechanism'] == m]
    series = {}
    for inputs_name in dict.fromkeys(r['inputs'] for r in mine):
      pts = [r for r in mine if r['inputs'] == inputs_name]
      series[inputs_name] = ([r['resolved'] for r in pts], [r['error'] for r in pts])
    panels.append((f"{m}: error vs {mine[0]['option']}", series))
  if not panels:
    return None
  return output.line_plot(
    path,
    panels,
    xlabel='knob value',
    ylabel='relative error',
    suptitle=title,
    ncols=min(3, len(panels)),
  )


def sweep_plot(path: str, rows, key: str, xlabel: str, title: str) -> Optional[str]:
  """Error against `key` ('length' or 'qk_scale'), a line per mechanism."""
  series = {}
  for m in dict.fromkeys(r['mechanism'] for r in rows):
    pts = [r for r in rows if r['mechanism'] == m]
    series[m] = ([r[key] for r in pts], [r['error'] for r in pts])
  if not series:
    return None
  return output.line_plot(
    path, [(f'error vs {key}', series)], xlabel=xlabel, ylabel='relative error', suptitle=title
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = common.parse_flags(define_flags, argv, __doc__)
  info = common.device_info()
  with common.flag_errors():
    mechanisms = (
      common.csv_list(args.mechanisms)
      if args.mechanisms
      else [m for m in common.available_mechanisms() if m != 'softmax']
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
    options = {m: common.effective_options(m, fixed.get(m)) for m in mechanisms}
    lengths = common.csv_list(args.lengths, int, '--lengths')
    scales = common.csv_list(args.scales, float, '--scales')
    sources = [runs.load_source(name, args.num_examples) for name in args.source]

  inputs = {
    f'random, n={args.knob_length}': (args.knob_length, random_draws(args, args.knob_length))
  }
  checkpoint_inputs = {}
  for name, source in zip(args.source, sources):
    layers = runs.capture_qkv(source)
    length = layers[0][1][1].shape[1]
    checkpoint_inputs[f'{name} (captured q,k,v)'] = (
      length,
      {layer: [(0, qkv)] for layer, qkv in layers},
    )
  knob_rows = knob_sweep(args, mechanisms, knobs, fixed, inputs)
  ckpt_rows = knob_sweep(args, mechanisms, knobs, fixed, checkpoint_inputs)
  length_rows = length_sweep(args, mechanisms, fixed, lengths)
  scale_rows = scale_sweep(args, mechanisms, fixed, scales)
  identity_rows = [] if args.no_identities else identity_checks(args, mechanisms)

  meta = dict(
    device=info,
    device_line=common.describe_device(info),
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
  sub = common.describe_device(info)
  plots = [
    p
    for p in (
      knob_plot(
        os.path.join(args.out, f'{args.name}_knob.png'),
        knob_rows,
        f'Relative error vs knob, random inputs; {sub}',
      ),
      sweep_plot(
        os.path.join(args.out, f'{args.name}_length.png'),
        length_rows,
        'length',
        'sequence length (tokens)',
        f'Relative error vs length, random inputs, default options; {sub}',
      ),
      sweep_plot(
        os.path.join(args.out, f'{args.name}_scale.png'),
        scale_rows,
        'qk_scale',
        'std of q and k entries',
        f'Relative error vs q, k scale, n={args.knob_length}, default options; {sub}',
      ),
      knob_plot(
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
    markdown(meta, knob_rows + ckpt_rows, length_rows, scale_rows, identity_rows),
    quiet=args.quiet,
  )
  return data


if __name__ == '__main__':
  main()

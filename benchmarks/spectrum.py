r"""Spectrum of the attention matrix, as in the Linformer paper (Wang et al. 2020, section 3).

For each source (a trained workdir, or 'random:<mechanism>' for an untrained
ViT), a batch of its eval inputs is run through the model, the projected q, k
of every attention layer are captured, and each head's softmax attention matrix
P = softmax(q k^T / sqrt(d)) `[n, n]` is formed (for token inputs, over the
real tokens only: id 0 is padding). From P's singular values s_1 >= s_2 >= ...
the cumulative energy curve is

    E(u) = sum_{i <= u} s_i / sum_i s_i          (the Linformer paper's definition; default)
    E(u) = sum_{i <= u} s_i^2 / sum_i s_i^2      (--energy=sigma2: Frobenius share)

and the rank needed for --threshold (default 90%) energy is min{u : E(u) >=
threshold}. The matrix is exact softmax whatever mechanism the model was trained
with: it is the attention the trained q, k define.

    python -m benchmarks.spectrum --source=runs/digits --out=benchmark_results/spectrum

Writes <out>/<name>.json, .md, <name>_energy.png (curves per layer, mean over
heads and examples, band = range over heads) and <name>_rank.png (rank at the
threshold, layer x head, a panel per source).
"""

import os
from typing import Any, Dict, List, Optional, Sequence

from absl import flags
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import runs
from efficient_attn.mechanisms.softmax import softmax_weights


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/spectrum', name='spectrum')
  flags.DEFINE_multi_string(
    'source',
    [],
    "workdir or 'random:<mechanism>' (repeatable; default random:softmax)",
    flag_values=fv,
  )
  flags.DEFINE_integer('num_examples', 8, 'eval examples per source', flag_values=fv)
  flags.DEFINE_float('threshold', 0.9, 'energy fraction of the reported rank', flag_values=fv)
  flags.DEFINE_enum(
    'energy',
    'sigma',
    ['sigma', 'sigma2'],
    'energy of a singular value: sigma or sigma^2',
    flag_values=fv,
  )
  flags.DEFINE_string('ks', '8,16,32,64', 'report the energy captured by top-k', flag_values=fv)
  flags.DEFINE_integer('seed', 0, 'random seed', flag_values=fv)


# ----------------------------------------------------------------------------
# The math.
# ----------------------------------------------------------------------------


def energy_curve(singular_values: np.ndarray, squared: bool = False) -> np.ndarray:
  """Cumulative energy `[..., n]` of descending singular values `[..., n]`."""
  s = np.asarray(singular_values, np.float64)
  s = s * s if squared else s
  return np.cumsum(s, axis=-1) / np.maximum(s.sum(axis=-1, keepdims=True), 1e-30)


def rank_for(curve: np.ndarray, threshold: float) -> np.ndarray:
  """Smallest u (1-based) with curve[u - 1] >= threshold, over the last axis."""
  return np.argmax(curve >= threshold - 1e-12, axis=-1) + 1


def attention_spectra(
  q, k, key_padding: Optional[np.ndarray] = None, squared: bool = False
) -> np.ndarray:
  """Energy curves `[batch, heads, n]` of each example's and head's softmax matrix.

  q, k: `[batch, n, heads, d]`. key_padding: bool `[batch, n]`, True = real
  token; an example with L real tokens uses its L x L block and its curve is
  1 from index L on.
  """
  q, k = np.asarray(q), np.asarray(k)
  b, n, h, _ = q.shape
  curves = np.ones((b, h, n))
  for i in range(b):
    real = slice(None) if key_padding is None else np.asarray(key_padding[i], bool)
    qi, ki = q[i : i + 1, real], k[i : i + 1, real]
    p = np.asarray(softmax_weights(jnp.asarray(qi), jnp.asarray(ki)))[0]  # [h, L, L]
    s = np.linalg.svd(p.astype(np.float64), compute_uv=False)  # [h, L]
    curves[i, :, : s.shape[-1]] = energy_curve(s, squared)
  return curves


def token_padding(inputs) -> Optional[np.ndarray]:
  """Real-token mask for integer token inputs `[batch, n]` (0 = padding), else None."""
  x = np.asarray(inputs)
  if x.ndim == 2 and np.issubdtype(x.dtype, np.integer):
    return x != 0
  return None


def analyse(source: runs.Source, args) -> Dict[str, Any]:
  """Per layer: mean curve, per-head ranks at the threshold, top-k energies."""
  layers = runs.capture_qkv(source)
  padding = token_padding(source.inputs)
  ks = common.csv_list(args.ks, int)
  out = []
  for name, (q, k, _) in layers:
    curves = attention_spectra(q, k, padding, args.energy == 'sigma2')  # [b, h, n]
    ranks = rank_for(curves, args.threshold)  # [b, h]
    n = curves.shape[-1]
    out.append(
      dict(
        layer=name,
        length=n,
        heads=curves.shape[1],
        mean_curve=curves.mean(axis=(0, 1)),
        head_curves=curves.mean(axis=0),
        rank_per_head=ranks.mean(axis=0),
        rank_mean=float(ranks.mean()),
        rank_min=int(ranks.min()),
        rank_max=int(ranks.max()),
        energy_top_k={kk: float(curves[..., kk - 1].mean()) for kk in ks if kk <= n},
      )
    )
  return dict(
    source=source.name, info=source.info, num_examples=int(np.shape(source.inputs)[0]), layers=out
  )


# ----------------------------------------------------------------------------
# Output.
# ----------------------------------------------------------------------------


def markdown(meta, results) -> str:
  pct = f"{meta['threshold']:.0%}"
  notes = [
    'P = softmax(q k^T / sqrt(d)) per layer and head from the captured q, k on eval inputs; '
    'energy E(u) = '
    + (
      'sum of the top-u singular values / sum of all (Wang et al. 2020)'
      if meta['energy'] == 'sigma'
      else 'sum of the top-u squared singular values / sum of all (Frobenius)'
    ),
    f'rank = smallest u with E(u) >= {pct}, averaged over examples; min/max over heads '
    'and examples.',
  ]
  parts = [output.header('Spectrum of the attention matrix', meta['device_line'], notes)]
  for res in results:
    ks = sorted({kk for layer in res['layers'] for kk in layer['energy_top_k']})
    info = res['info']
    parts += [
      f"## {res['source']} ({info.get('dataset')}, {info.get('mechanism')}/"
      f"{info.get('projection')}, {res['num_examples']} examples)",
      '',
      output.table(
        ['layer', 'n', f'rank for {pct} (mean)', 'min', 'max', 'rank / n']
        + [f'E(top-{kk})' for kk in ks]
        + ['rank per head'],
        [
          [
            l['layer'],
            l['length'],
            f"{l['rank_mean']:.1f}",
            l['rank_min'],
            l['rank_max'],
            f"{l['rank_mean'] / l['length']:.2f}",
          ]
          + [output.fmt_num(l['energy_top_k'].get(kk), 3) for kk in ks]
          + [' '.join(f'{r:.0f}' for r in l['rank_per_head'])]
          for l in res['layers']
        ],
        'lrrrrr' + 'r' * len(ks) + 'l',
      ),
      '',
    ]
  return '\n'.join(parts)


def plots(out, name, meta, results) -> List[str]:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  n_src = len(results)
  fig, axes = plt.subplots(1, n_src, figsize=(5.6 * n_src, 4.2), squeeze=False)
  for ax, res in zip(axes[0], results):
    for layer in res['layers']:
      u = np.arange(1, layer['length'] + 1)
      label = f"{layer['layer']} (r={layer['rank_mean']:.0f})"
      (line,) = ax.plot(u, layer['mean_curve'], label=label)
      hc = np.asarray(layer['head_curves'])
      ax.fill_between(u, hc.min(axis=0), hc.max(axis=0), color=line.get_color(), alpha=0.15)
    ax.axhline(meta['threshold'], color='gray', linestyle=':', linewidth=1)
    ax.set_xlabel('number of singular values u')
    ax.set_ylabel('cumulative energy E(u)')
    ax.set_title(short_name(res['source']), fontsize=10)
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle(
    f"Cumulative singular-value energy of softmax attention matrices "
    f"({meta['energy']}); {meta['device_line']}",
    fontsize=9,
  )
  energy_path = output.save_figure(fig, os.path.join(out, f'{name}_energy.png'))
  panels = []
  for res in results:
    ranks = np.array([l['rank_per_head'] for l in res['layers']])
    panels.append(
      (
        short_name(res['source']),
        ranks,
        [str(h) for h in range(ranks.shape[1])],
        [l['layer'].split('/')[-2] if '/' in l['layer'] else l['layer'] for l in res['layers']],
      )
    )
  rank_path = output.heatmaps(
    os.path.join(out, f'{name}_rank.png'),
    panels,
    xlabel='head',
    ylabel='layer',
    colorbar='rank',
    suptitle=f"rank for {meta['threshold']:.0%} energy (mean over examples)",
  )
  return [energy_path, rank_path]


def short_name(source: str) -> str:
  return os.path.basename(source.rstrip('/')) or source


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = common.parse_flags(define_flags, argv, __doc__)
  info = machine.device_info()
  sources = args.source or ['random:softmax']
  with common.flag_errors():  # every source before any is analysed
    common.csv_list(args.ks, int, '--ks')
    loaded = [runs.load_source(name, args.num_examples, args.seed) for name in sources]
  results = []
  for name, source in zip(sources, loaded):
    res = analyse(source, args)
    results.append(res)
    if not args.quiet:
      for l in res['layers']:
        print(
          f"[spectrum] {name}: {l['layer']} n={l['length']} rank@{args.threshold:.0%} "
          f"{l['rank_mean']:.1f}",
          flush=True,
        )
  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
    threshold=args.threshold,
    energy=args.energy,
    sources=sources,
    num_examples=args.num_examples,
    command=output.command('benchmarks.spectrum', argv),
  )
  pngs = plots(args.out, args.name, meta, results)
  data = dict(meta=meta, results=results, plots=pngs)
  output.finish(args.out, args.name, data, markdown(meta, results), quiet=args.quiet)
  return data


if __name__ == '__main__':
  main()

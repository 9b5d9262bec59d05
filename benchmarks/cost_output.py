"""benchmarks.cost's output: the markdown tables and the figures of FLOPs, memory and
parameters."""

import os
from typing import Dict, List

from benchmarks import output
import efficient_attn as ea


def scaling_value(scaling_rows, mechanism: str, length: int, key: str):
  """`key` of the measured row of `mechanism` at `length` in the scaling table; None if not
  measured."""
  return next(
    (
      r.get(key)
      for r in scaling_rows
      if r['mechanism'] == mechanism and r['length'] == length and r['status'] == 'ok'
    ),
    None,
  )


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
  rows = []
  for m, s in meta['scaling'].items():
    decl = ea.get_mechanism(m)
    (comp, mem), src = decl.complexity, decl.citation
    rows.append(
      [m, comp, mem, src]
      + [output.fmt_count(scaling_value(scaling_rows, m, n, 'fwd_flops')) for n in ns]
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


def write_plots(out, name, meta, layer_rows, scaling_rows) -> List[str]:
  ns = meta['lengths']
  series = {
    m: (ns, [scaling_value(scaling_rows, m, n, 'fwd_flops') for n in ns]) for m in meta['scaling']
  }
  mem = {
    m: (ns, [scaling_value(scaling_rows, m, n, 'fwd_memory_bytes') for n in ns])
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

"""benchmarks.speed's output: the markdown tables and the figures of time, memory and
speedup against length."""

import os
from typing import List

from benchmarks import output
from benchmarks import speed_summary

MODE_TITLES = {'fwd': 'forward', 'fwd_bwd': 'forward + backward'}


def exponent_cell(exponent, fit_lengths, lo, hi) -> str:
  """'1.02', or '1.98 (1024-8192)' when the measured points cover less than lo..hi."""
  if exponent is None:
    return None
  text = f'{exponent:.3g}'
  if fit_lengths and (min(fit_lengths) > lo or max(fit_lengths) < hi):
    text += f' ({min(fit_lengths)}-{max(fit_lengths)})'
  return text


def exponent_column(entries, kind: str):
  """('exponent lo-hi', cells) of the `kind` ('time' or 'memory') exponents of `entries`
  (`summarise`'s, one per row), lo-hi the lengths actually fitted; None when no row was
  fitted (fewer than two of its lengths inside --fit_range), so the table leaves it out."""
  fitted = [s for s in entries if s[f'{kind}_exponent'] is not None]
  if not fitted:
    return None
  lengths = [n for s in fitted for n in s['fit_lengths']]
  lo, hi = min(lengths), max(lengths)
  return f'exponent {lo}-{hi}', [
    exponent_cell(s[f'{kind}_exponent'], s['fit_lengths'], lo, hi) for s in entries
  ]


def with_column(heads, rows, column):
  """`heads` and `rows` with `column` (a header and a cell per row) appended, if any."""
  if column is None:
    return heads, rows
  return heads + [column[0]], [row + [cell] for row, cell in zip(rows, column[1])]


def causality(meta) -> str:
  """'causal', 'non-causal', or which targets ran causal because they are causal only."""
  if meta['causal']:
    return 'causal'
  only = meta.get('causal_only_targets', [])
  if only and len(only) == len(meta.get('targets', only)):
    return 'causal (every target is causal only)'
  if only:
    return f"non-causal, except the causal-only {', '.join(only)} (causal)"
  return 'non-causal'


def markdown(meta, points, summary, targets, modes, ratios=None) -> str:
  fit_lo, fit_hi = meta['fit_range']
  notes = [
    f"batch {meta['batch']}, {meta['heads']} heads, head_dim {meta['head_dim']}, "
    f"{meta['dtype']}, {causality(meta)}; 'exact' is "
    f"`jax.nn.dot_product_attention` (implementation: {meta['exact_implementation']}); "
    "layers 'mechanism/projection' are whole MultiHeadAttention layers "
    f"(d_model = {meta['heads'] * meta['head_dim']}).",
    f"time: {meta['statistic']} of up to {meta['repeats']} calls after compilation and one "
    "warm-up "
    f"(block_until_ready), fewer once they pass {meta['time_budget_s'] / 2:g} s; a warm-up "
    f"over {meta['time_budget_s']:g} s is the single measurement; points predicted over "
    f"{meta['max_time_s']:g} s per call are skipped.",
    f"memory: {meta['memory_description']}",
    f"exponent: slope of log(time) against log(length) over lengths {fit_lo}..{fit_hi} "
    '(only measured points).',
    'options: '
    + '; '.join(
      f'{k}: ' + ', '.join(f'{option}={v}' for option, v in opts.items() if v is not None)
      for k, opts in meta['options'].items()
      if opts
    ),
  ]
  why = speed_summary.no_speedup(summary, targets, modes)
  if why:
    notes.append(why)
  parts = [output.header('Attention speed and memory', meta['device_line'], notes)]
  all_ns = sorted({p['length'] for p in points})
  for mode in modes:
    title = MODE_TITLES[mode]
    rows, sp_rows, mem_rows = [], [], []
    entries = [summary[f'{t}:{mode}'] for t in targets]
    for t, s in zip(targets, entries):
      rows.append(
        [t] + [output.fmt_time(speed_summary.point_value(points, t, mode, n)) for n in all_ns]
      )
      sp_rows.append([t] + [output.fmt_num(s['speedup_vs_exact'].get(n), 3) for n in all_ns])
      mem_rows.append(
        [t]
        + [
          output.fmt_bytes(speed_summary.point_value(points, t, mode, n, 'memory_bytes'))
          for n in all_ns
        ]
      )
    heads = ['target'] + [str(n) for n in all_ns]
    parts += [
      f'## {title}: time per call',
      '',
      output.table(*with_column(heads, rows, exponent_column(entries, 'time'))),
      '',
    ]
    if any(s['speedup_vs_exact'] for s in entries):  # else every cell would be '-'
      parts += [
        f'## {title}: speedup vs exact (time of exact / time)',
        '',
        output.table(heads, sp_rows),
        '',
      ]
    parts += [
      f'## {title}: peak memory ({meta["memory_source"]})',
      '',
      output.table(*with_column(heads, mem_rows, exponent_column(entries, 'memory'))),
      '',
    ]
  if ratios:
    all_ns = sorted({p['length'] for p in points})
    for mode in modes:
      rows = [
        [f'{a} / {b}'] + [output.fmt_num(ratios[f'{a}:{b}:{mode}'].get(n), 3) for n in all_ns]
        for a, b in meta['compare']
      ]
      parts += [
        f'## {MODE_TITLES[mode]}: time ratios (--compare a:b, time of a / time of b)',
        '',
        output.table(['a / b'] + [str(n) for n in all_ns], rows),
        '',
      ]
  missing = [p for p in points if p['status'] != 'ok']
  if missing:
    parts += [
      '## Points not measured',
      '',
      output.table(
        ['target', 'mode', 'length', 'status', 'reason'],
        [[p['target'], p['mode'], p['length'], p['status'], p['reason']] for p in missing],
        'lllll',
      ),
      '',
    ]
  return '\n'.join(parts)


def write_plots(out, name, meta, points, summary, targets, modes) -> List[str]:
  """Writes <out>/<name>_time.png, _memory.png and, when exact was measured, _speedup.png
  (an older _speedup.png is removed otherwise); returns their paths."""

  def series(key, values=None):
    panels = []
    for mode in modes:
      s = {}
      for t in targets:
        ns = sorted({p['length'] for p in points if p['target'] == t and p['mode'] == mode})
        ys = [
          (values(t, mode, n) if values else speed_summary.point_value(points, t, mode, n, key))
          for n in ns
        ]
        exp = summary[f'{t}:{mode}']['time_exponent']
        label = t if key != 'time_s' or exp is None else f'{t} (slope {exp:.2f})'
        s[label] = (ns, ys)
      panels.append((MODE_TITLES[mode], s))
    return panels

  sub = (
    f"batch {meta['batch']}, {meta['heads']} heads, head_dim {meta['head_dim']}, "
    f"{meta['dtype']} — {meta['device_line']}"
  )
  mem_unit = lambda t, m, n: (
    ((speed_summary.point_value(points, t, m, n, 'memory_bytes') or 0) / 2**20) or None
  )
  pngs = [
    output.line_plot(
      os.path.join(out, f'{name}_time.png'),
      series('time_s'),
      xlabel='sequence length (tokens)',
      ylabel='time per call (s)',
      suptitle='Attention time vs length (log-log); ' + sub,
    ),
    output.line_plot(
      os.path.join(out, f'{name}_memory.png'),
      series(None, mem_unit),
      xlabel='sequence length (tokens)',
      ylabel=f"peak memory (MiB, {meta['memory_source']})",
      suptitle='Attention peak memory vs length (log-log); ' + sub,
    ),
  ]
  speedup = os.path.join(out, f'{name}_speedup.png')
  if speed_summary.no_speedup(summary, targets, modes) is None:
    pngs.append(
      output.line_plot(
        speedup,
        series(None, lambda t, m, n: summary[f'{t}:{m}']['speedup_vs_exact'].get(n)),
        xlabel='sequence length (tokens)',
        ylabel='speedup vs exact (×)',
        suptitle='time of exact attention / time of target; ' + sub,
        hlines=[(1.0, 'exact')],
      )
    )
  elif os.path.exists(speedup):  # an earlier run's: it is not this run's
    os.remove(speedup)
  return pngs

"""benchmarks.approx_error's output: the markdown tables and the figures of error against
knob, length and scale."""

from typing import Optional

from benchmarks import output


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

"""Writing results: JSON, markdown tables, PNG plots (matplotlib, Agg backend)."""

import json
import math
import os
import sys
import textwrap
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import matplotlib

matplotlib.use('Agg')
from matplotlib import ticker  # pylint: disable=g-import-not-at-top,wrong-import-position
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

MISSING = '–'


def jsonable(x: Any) -> Any:
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    x = float(x)
  if isinstance(x, float) and not math.isfinite(x):
    return None  # JSON has no NaN / inf
  if isinstance(x, np.ndarray):
    return [jsonable(v) for v in x.tolist()]
  if isinstance(x, Mapping):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if hasattr(x, 'item') and callable(x.item) and getattr(x, 'shape', None) == ():
    return jsonable(x.item())
  return x


def command(module: str, argv: Optional[Sequence[str]] = None) -> str:
  """The command line that reproduces a run: `python -m <module>` and its arguments
  (`argv`, or this process's when None)."""
  return ' '.join([f'python -m {module}'] + list(argv if argv is not None else sys.argv[1:]))


def write_json(path: str, data: Any) -> str:
  """Writes `data` as JSON, atomically (a kill leaves the old file or the new one)."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump(jsonable(data), f, indent=1, allow_nan=False)
    f.write('\n')
  os.replace(tmp, path)
  return path


def write_text(path: str, text: str) -> str:
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  with open(path, 'w') as f:
    f.write(text if text.endswith('\n') else text + '\n')
  return path


def finish(
  out_dir: str, name: str, data: Mapping[str, Any], markdown: str, quiet: bool = False
) -> Dict[str, str]:
  """Writes `<out_dir>/<name>.json` and `.md`, prints the markdown; returns the paths."""
  paths = dict(
    json=write_json(os.path.join(out_dir, f'{name}.json'), data),
    markdown=write_text(os.path.join(out_dir, f'{name}.md'), markdown),
  )
  if not quiet:
    print(markdown)
    plots = sorted(f for f in os.listdir(out_dir) if f.startswith(name) and f.endswith('.png'))
    print(
      f'wrote {paths["json"]}, {paths["markdown"]}'
      + (f' and {", ".join(plots)} in {out_dir}' if plots else '')
    )
  return paths


def finish_table(
  out_dir: str,
  name: str,
  title: str,
  device_line: str,
  notes: Sequence[str],
  table_markdown: str,
  data: Mapping[str, Any],
  quiet: bool = False,
) -> Dict[str, str]:
  """`finish` for a report of one table: the header (title, device, notes), then the table."""
  markdown = '\n'.join([header(title, device_line, notes), table_markdown, ''])
  return finish(out_dir, name, data, markdown, quiet=quiet)


# ----------------------------------------------------------------------------
# Markdown.
# ----------------------------------------------------------------------------


def table(
  headers: Sequence[str], rows: Iterable[Sequence[Any]], align: Optional[str] = None
) -> str:
  """A GitHub markdown table; `align` is one char per column ('l' or 'r'; default:
  first column left, others right). None cells print as MISSING."""
  headers = [str(h) for h in headers]
  align = align or 'l' + 'r' * (len(headers) - 1)
  lines = [
    '| ' + ' | '.join(headers) + ' |',
    '|' + '|'.join(':---' if a == 'l' else '---:' for a in align) + '|',
  ]
  for row in rows:
    cells = [MISSING if c is None else str(c) for c in row]
    lines.append('| ' + ' | '.join(c.replace('|', '\\|') for c in cells) + ' |')
  return '\n'.join(lines)


def fmt_time(seconds: Optional[float]) -> Optional[str]:
  if seconds is None:
    return None
  if seconds < 1e-3:
    return f'{seconds * 1e6:.0f} µs'
  if seconds < 1:
    return f'{seconds * 1e3:.3g} ms'
  return f'{seconds:.3g} s'


def fmt_bytes(n: Optional[float]) -> Optional[str]:
  if n is None:
    return None
  for unit, size in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
    if n >= size:
      return f'{n / size:.3g} {unit}'
  return f'{int(n)} B'


def fmt_count(n: Optional[float]) -> Optional[str]:
  """12345678 -> '12.3M'; below 10^4, integers in full, 6610.3 -> '6,610', 2.345 -> '2.35'."""
  if n is None or (isinstance(n, float) and not math.isfinite(n)):
    return None
  for unit, size in (('T', 1e12), ('G', 1e9), ('M', 1e6), ('K', 1e3)):
    if abs(n) >= size and abs(n) >= 1e4:
      return f'{n / size:.3g}{unit}'
  if float(n).is_integer() or abs(n) >= 100:  # '.3g' would write 6610.3 as '6.61e+03'
    return f'{round(n):,}'
  return f'{n:.3g}'


def fmt_num(x: Optional[float], digits: int = 3) -> Optional[str]:
  if x is None or (isinstance(x, float) and not math.isfinite(x)):
    return None
  return f'{x:.{digits}g}'


def header(
  title: str, device_line: str, notes: Sequence[str] = (), label: str = 'Measured on'
) -> str:
  lines = [f'# {title}', '', f'{label}: {device_line}', '']
  lines += [f'- {n}' for n in notes]
  return '\n'.join(lines) + ('\n' if notes else '')


# ----------------------------------------------------------------------------
# Plots.
# ----------------------------------------------------------------------------

Series = Mapping[str, Tuple[Sequence[float], Sequence[Optional[float]]]]


def save_figure(fig, path: str) -> str:
  """Lay out, write `path` (PNG, 80 dpi, folders created) and close `fig`."""
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  fig.savefig(path, dpi=80)
  plt.close(fig)
  return path


def line_plot(
  path: str,
  panels: Sequence[Tuple[str, Series]],
  *,
  xlabel: str,
  ylabel: str,
  suptitle: str = '',
  logx: bool = True,
  logy: bool = True,
  hlines: Sequence[Tuple[float, str]] = (),
  ncols: Optional[int] = None,
  integer_x: bool = False,
) -> str:
  """One figure with a panel per (title, {label: (xs, ys)}), `ncols` panels a row.

  Missing (None / non-finite) ys are skipped; `hlines`: (y, label) reference
  lines on every panel. Log x axes are base 2 with plain-number tick labels;
  `integer_x` puts x ticks on whole numbers only (rounds, epochs).
  """
  ncols = ncols or max(1, len(panels))
  nrows = max(1, math.ceil(len(panels) / ncols))
  fig, axes = plt.subplots(nrows, ncols, figsize=(5.6 * ncols, 4.2 * nrows), squeeze=False)
  for ax, (title, series) in zip(axes.flat, panels):
    colors = plt.get_cmap('tab10' if len(series) <= 10 else 'tab20').colors
    for i, (label, (xs, ys)) in enumerate(series.items()):
      pts = [
        (x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y) and (y > 0 or not logy)
      ]
      if not pts:
        continue
      ax.plot(
        *zip(*pts),
        marker='os^vD<>ph*'[i % 10],
        linestyle='-' if i < 10 else '--',
        color=colors[i % len(colors)],
        label=label,
      )
    for y, label in hlines:
      ax.axhline(y, color='gray', linestyle=':', linewidth=1)
      ax.annotate(
        label, (0.01, y), xycoords=('axes fraction', 'data'), fontsize=8, color='gray', va='bottom'
      )
    if logx:
      ax.set_xscale('log', base=2)
      ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f'{x:g}'))
    if integer_x:
      ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    if logy:
      ax.set_yscale('log')
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which='both', alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  for ax in list(axes.flat)[len(panels) :]:
    ax.axis('off')
  if suptitle:
    fig.suptitle(textwrap.fill(suptitle, int(13 * 5.6 * ncols)), fontsize=9)
  return save_figure(fig, path)


def heatmaps(
  path: str,
  panels: Sequence[Tuple[str, Any, Sequence[str], Sequence[str]]],
  *,
  xlabel: str,
  ylabel: str,
  colorbar: str,
  suptitle: str = '',
) -> str:
  """Annotated heatmaps of small 2-D arrays, one panel per (title, values, xticks, yticks)."""
  width = sum(2.0 + 0.6 * np.shape(v)[1] for _, v, _, _ in panels)
  height = 1.8 + 0.5 * max(np.shape(v)[0] for _, v, _, _ in panels)
  fig, axes = plt.subplots(1, len(panels), figsize=(max(5.0, width), height), squeeze=False)
  for ax, (title, values, xticks, yticks) in zip(axes[0], panels):
    values = np.asarray(values, float)
    im = ax.imshow(values, cmap='viridis', aspect='auto')
    ax.set_xticks(range(len(xticks)), xticks)
    ax.set_yticks(range(len(yticks)), yticks)
    for (i, j), v in np.ndenumerate(values):
      ax.text(
        j,
        i,
        f'{v:.0f}',
        ha='center',
        va='center',
        fontsize=8,
        color='white' if v < np.nanmean(values) else 'black',
      )
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, label=colorbar)
  if suptitle:
    fig.suptitle(suptitle, fontsize=9)
  return save_figure(fig, path)

"""The recall study's figures: accuracy against width, against the decode state, and the
training curves. A colour per mechanism, the same in every figure of one report."""

import textwrap
from typing import Any, Dict, List, Sequence

import numpy as np

from studies.recall import tables

# Line styles, one per budget or seed: seven that matplotlib draws apart.
STYLES = ('-', '--', ':', '-.', (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)))


def legend_label(label: str) -> str:
  """A row's label for a legend: its options below its mechanism, a few to a line."""
  return textwrap.fill(label, width=24, break_long_words=False)


def mechanism_with_budget(r: Dict[str, Any], budgets: int) -> str:
  """The mechanism, with its budget when the report holds more than one."""
  return r['mechanism'] + (f' ({tables.budget(r)})' if budgets > 1 else '')


def seed_range(rows: Sequence[Dict[str, Any]]) -> np.ndarray:
  """Error bars `[2, len(rows)]` in percent from each row's mean down to its lowest seed and
  up to its highest: the seeds' range (half the range each way for two seeds; for three, not
  below the lowest seed, as mean ± half the range can be)."""
  return 100 * np.array(
    [[r['mean'] - min(r['accuracy']) for r in rows], [max(r['accuracy']) - r['mean'] for r in rows]]
  ).reshape(2, len(rows))


def colours(runs: List[Dict[str, Any]]) -> Dict[str, str]:
  """A colour per mechanism of `runs` (or rows), the same in every plot of one report.

  Distinct for up to 20 mechanisms: past the default cycle's 10, tab20's 20 colours.
  """
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  mechanisms = sorted({r['mechanism'] for r in runs})
  palette = plt.rcParams['axes.prop_cycle'].by_key()['color']
  if len(mechanisms) > len(palette):
    palette = list(plt.get_cmap('tab20').colors)
  return {m: palette[i % len(palette)] for i, m in enumerate(mechanisms)}


def plot_accuracy(rows: List[Dict[str, Any]], path: str) -> None:
  """Test accuracy against width, a panel per cell (a line per mechanism, error bars over
  seeds); a cell run at one width: a bar per mechanism."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  budgets = tables.count_budgets(rows)
  # One line per mechanism and budget: a colour per mechanism in every panel, so the panels
  # read side by side, and a line style per budget.
  mechanism_colour = colours(rows)
  budget_style = {
    b: STYLES[i % len(STYLES)] for i, b in enumerate(sorted({tables.budget(r) for r in rows}))
  }
  colour = {mechanism_with_budget(r, budgets): mechanism_colour[r['mechanism']] for r in rows}
  style = {mechanism_with_budget(r, budgets): budget_style[tables.budget(r)] for r in rows}
  by_cell: Dict[tuple, List[Dict[str, Any]]] = {}
  for r in rows:
    by_cell.setdefault((r['seq_len'], r['num_kv_pairs']), []).append(
      dict(r, mechanism=mechanism_with_budget(r, budgets))
    )
  # A cell run at one width is drawn as bars named below the panel: room for their names.
  one_width = any(len({r['width'] for r in mine}) == 1 for mine in by_cell.values())
  cells = sorted(by_cell)
  fig, axes = plt.subplots(
    1,
    len(cells),
    figsize=(5 * len(cells) + 3 * (budgets > 1), 4 + 2 * (one_width and budgets > 1)),
    squeeze=False,
  )
  for ax, (seq_len, pairs) in zip(axes[0], cells):
    mine = by_cell[seq_len, pairs]
    widths = sorted({r['width'] for r in mine})
    mechanisms = sorted({r['mechanism'] for r in mine})
    if len(widths) > 1:
      for i, m in enumerate(mechanisms):
        line = sorted((r for r in mine if r['mechanism'] == m), key=lambda r: r['width'])
        w, mean = (np.array([r[k] for r in line]) for k in ('width', 'mean'))
        # Each line a little to the side (4% of a doubling apart), so that mechanisms at the
        # same accuracy (softmax and DeltaNet at 100%) do not hide one another.
        dodge = 2.0 ** (0.04 * (i - (len(mechanisms) - 1) / 2))
        ax.errorbar(
          w * dodge,
          100 * mean,
          yerr=seed_range(line),
          marker='o',
          capsize=3,
          label=legend_label(m),
          color=colour[m],
          linestyle=style[m],
        )
      ax.set_xscale('log', base=2)
      ax.set_xticks(widths, [str(w) for w in widths])
      ax.set_xlabel('width (d_model)')
      ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.0, 1.0))
    else:
      mine.sort(key=lambda r: -r['mean'])
      ax.bar(
        range(len(mine)),
        [100 * r['mean'] for r in mine],
        yerr=seed_range(mine),
        capsize=3,
        color=[colour[r['mechanism']] for r in mine],
      )
      ax.set_xticks(
        range(len(mine)), [r['mechanism'] for r in mine], rotation=45, ha='right', fontsize=7
      )
      ax.set_xlabel(f'mechanism (width {widths[0]})')
    ax.set_ylim(-2, 102)  # a line at 100% or at chance stays in view
    ax.set_ylabel('MQAR test accuracy (%)')
    ax.set_title(f'seq_len {seq_len}, {pairs} key-value pairs')
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches='tight')  # the legends beside the panels, uncut


def plot_curves(runs: List[Dict[str, Any]], path: str) -> None:
  """Training accuracy (the logged running mean) against step for every run that has a curve
  (a run given back by a report written before curves were kept has none; the title counts
  them): a panel per width and cell (and budget, when the drawn runs have several), a colour
  per mechanism (as in `plot_accuracy`), a line style per seed, one legend for the figure."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import lines as mlines  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  drawn = [r for r in runs if r.get('curve') and r['curve'][0]]
  budgets = tables.count_budgets(drawn)
  colour = colours(runs)

  def panel(r):
    return (r['width'], r['seq_len'], r['num_kv_pairs']) + (
      (tables.budget(r),) if budgets > 1 else ()
    )

  panels = sorted({panel(r) for r in drawn}) or [()]  # no curve at all: one empty panel
  seeds = sorted({r['seed'] for r in drawn})
  seed_style = {s: STYLES[i % len(STYLES)] for i, s in enumerate(seeds)}
  cols = min(2, len(panels))
  grid_rows = -(-len(panels) // cols)
  fig, axes = plt.subplots(
    grid_rows,
    cols,
    figsize=(4.5 * cols, 3 * grid_rows + 0.6),
    squeeze=False,
    sharex=True,
    sharey=True,
  )
  for ax, key in zip(axes.flat, panels):
    for r in sorted(
      (r for r in drawn if panel(r) == key), key=lambda r: (r['mechanism'], r['seed'])
    ):
      steps, acc = r['curve']
      ax.plot(
        steps,
        [100 * a for a in acc],
        color=colour[r['mechanism']],
        linestyle=seed_style[r['seed']],
        linewidth=1.2,
      )
    ax.set_ylim(-2, 102)  # as the other plots: a run at chance reads as one
    if key:
      ax.set_title(
        f'width {key[0]}, seq_len {key[1]}, {key[2]} pairs'
        + (f'\n{key[3]}' if len(key) > 3 else ''),
        fontsize=9,
      )
  for ax in axes.flat[len(panels) :]:
    ax.set_visible(False)
  for i, ax in enumerate(axes.flat[: len(panels)]):  # steps under each column's lowest panel
    if i + cols >= len(panels):
      ax.xaxis.set_tick_params(labelbottom=True)
      ax.set_xlabel('step')
  for ax in axes[:, 0]:
    ax.set_ylabel('MQAR training accuracy (%)')
  mechanisms = sorted({r['mechanism'] for r in drawn})
  handles = [mlines.Line2D([], [], color=colour[m], label=legend_label(m)) for m in mechanisms] + [
    mlines.Line2D([], [], color='black', linestyle=seed_style[s], label=f'seed {s}') for s in seeds
  ]
  if handles:
    fig.legend(handles=handles, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8)
  missing = len(runs) - len(drawn)
  fig.suptitle(
    (tables.budget(drawn[0]) if budgets == 1 else 'training accuracy')
    + (f'; {missing} of {len(runs)} runs have no stored curve' if missing else ''),
    fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches='tight')


def plot_state(rows: List[Dict[str, Any]], path: str) -> None:
  """Accuracy against decode state per sequence (log scale), as Zoology's recall-memory plot:
  a colour per mechanism (as in `plot_accuracy`), a marker per cell, a line through one mechanism's
  widths in one cell (and budget: a line style per budget when the rows hold several)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import lines as mlines  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  drawn = [r for r in rows if r['state_bytes'] is not None]
  colour = colours(rows)
  cells = sorted({(r['seq_len'], r['num_kv_pairs']) for r in drawn})
  cell_marker = {c: 'osD^vP*X'[i % 8] for i, c in enumerate(cells)}
  budgets = sorted({tables.budget(r) for r in drawn})
  budget_style = {b: STYLES[i % len(STYLES)] for i, b in enumerate(budgets)}
  fig, ax = plt.subplots(figsize=(7, 4.5))
  lines: Dict[tuple, List[Dict[str, Any]]] = {}
  for r in drawn:
    lines.setdefault(
      (r['mechanism'], r['seq_len'], r['num_kv_pairs'], tables.budget(r)), []
    ).append(r)
  for (m, seq_len, pairs, b), mine in sorted(lines.items()):
    mine.sort(key=lambda r: r['state_bytes'])
    ax.errorbar(
      [r['state_bytes'] for r in mine],
      [100 * r['mean'] for r in mine],
      yerr=seed_range(mine),
      color=colour[m],
      marker=cell_marker[seq_len, pairs],
      linestyle=budget_style[b],
      capsize=3,
      markersize=6,
      linewidth=1,
    )
  ax.set_xscale('log', base=2)  # ticks at powers of two, in KiB: no crowded minor labels
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f'{x / 1024:g} KiB'))
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())
  ax.set_ylim(-2, 102)
  ax.set_xlabel('decode state per sequence (log scale)')
  ax.set_ylabel('MQAR test accuracy (%)')
  ax.set_title('a line joins one mechanism\'s widths in one cell', fontsize=9)
  mechanisms = sorted({r['mechanism'] for r in drawn})
  handles = (
    [mlines.Line2D([], [], color=colour[m], label=legend_label(m)) for m in mechanisms]
    + [
      mlines.Line2D(
        [],
        [],
        color='black',
        marker=cell_marker[c],
        linestyle='none',
        label=f'seq_len {c[0]}, {c[1]} pairs',
      )
      for c in cells
    ]
    + (
      [mlines.Line2D([], [], color='black', linestyle=budget_style[b], label=b) for b in budgets]
      if len(budgets) > 1
      else []
    )
  )
  if handles:
    ax.legend(handles=handles, fontsize=7, loc='upper left', bbox_to_anchor=(1.0, 1.0))
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches='tight')

r"""The recall study's report: accuracy per mechanism, width and cell over seeds, with the decode state.

    python -m studies.recall.report 'runs/recall/seed*' --out=studies/recall --name=recall
    python -m studies.recall.report --states --out=studies/recall --name=recall
    python -m studies.recall.report --missing studies/recall/recall_d.json 'runs/recall/new/seed*'

Each argument is a folder (or a glob of folders) holding one workdir per run
(`python -m train.sweep --sweep=studies/recall/sweep.py --root=...`), or an
earlier report's .json: a workdir counts when its results.json holds the steps
its config asked for, and a report gives back the runs it was made of, so a
report outlives its workdirs and grows run by run:

    python -m studies.recall.report studies/recall/recall_d.json 'runs/recall/new/seed*' ...

(a run read from a workdir replaces the report's run of the same mechanism,
width, cell, budget and seed). The .json keeps every run (`runs`: its accuracy,
loss, throughput, decode state and training curve) beside the grouped `rows`; a
report written before `runs` existed gives its rows back seed by seed, without
loss or curve. Runs are grouped by (mechanism, width, seq_len, num_kv_pairs) and budget
(vocabulary, learning rate, steps); a group gives
the mean test accuracy over its seeds and the spread (half the range); the plots' error
bars reach from the lowest seed to the highest.

The decode state is the bytes of one sequence's decoding cache at the cell's
length, every layer (`benchmarks.generation.cache_bytes`: the key/value cache of
softmax and local attention, the recurrent state of the others, plus the
position counters), built from the run's stored config without its weights.

Writes <out>/<name>.json, <out>/<name>.md, <out>/<name>.png (accuracy
against width per mechanism, one panel per cell, when a cell has more than one
width; else accuracy per mechanism) and <out>/<name>_state.png (accuracy against
the decode state, log scale, a line through a mechanism's widths in one cell) and
<out>/<name>_curves.png (training accuracy against step, every run that has a curve: a
panel per width and cell, a colour per mechanism, a line style per seed). --mechanisms,
--widths and --budget keep some of the runs (the grid's figures: `--budget=4000,1e-3,1024
--name=recall_grid`).

With --missing it writes nothing: it prints the runs of the study's plan (`plan`: the
sweep's six mechanisms and Based's hybrid, `linear+local` with its options, at every
width and cell of GRID, every other causal mechanism at width 128, (256, 16), two seeds
each, at the sweep's default budget) that the sources do not hold, one
`seed:mechanism:width:cell[:settings]` per line, as studies/recall/gpu/run.sh takes
them (what they are, and the commands that run them, go to stderr). --mechanisms and
--widths narrow the plan; its budget is the sweep's (--budget, another one, is refused),
and a source that names no report and no folder is refused:

    python -m studies.recall.report --missing studies/recall/recall_d.json > runs.txt
    OUT=<folder> bash studies/recall/gpu/run.sh $(cat runs.txt)
"""

import glob
import json
import os
import sys
import textwrap
from typing import Any, Dict, List, Optional, Sequence

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common as tools
from benchmarks import runs as runs_io
from benchmarks.generation import cache_bytes
from configs import common
from configs import mqar
from efficient_attn import registry
from efficient_attn.layers import hybrid
from studies import hygiene
from studies.recall import sweep
from train import api

_OUT = flags.DEFINE_string('out', 'studies/recall', 'Folder for the report files.')
_NAME = flags.DEFINE_string('name', 'recall', 'Report file name (no extension).')
_STATES = flags.DEFINE_bool(
  'states',
  False,
  'Instead: the decode state of every causal '
  'mechanism at widths 64 and 128 and cells (128, 8) and (256, 16), '
  'written to <out>/<name>_states.md.',
)
_MECHANISMS = flags.DEFINE_list(
  'mechanisms',
  [],
  'Only these mechanisms (default: every one '
  'found); a row with an option off its default counts as its '
  'mechanism.',
)
_WIDTHS = flags.DEFINE_list('widths', [], 'Only these widths (default: every one).')
_BUDGET = flags.DEFINE_string(
  'budget',
  '',
  'Only the runs of this budget, '
  '"steps,learning_rate,vocab_size" (e.g. 4000,1e-3,1024; '
  'default: every one).',
)
_MISSING = flags.DEFINE_bool(
  'missing',
  False,
  'Instead: print the runs of the study\'s plan '
  'that the sources do not hold (seed:mechanism:width:cell'
  '[:settings], one '
  'per line, as studies/recall/gpu/run.sh takes them); writes nothing.',
)
GRID = ((64, 128, 8), (64, 256, 16), (128, 128, 8), (128, 256, 16))  # width, seq_len, pairs
ONE_CELL = (128, 256, 16)  # where every other causal mechanism runs once per seed
# Based's hybrid (Arora et al. 2024) as the grid runs it: its Taylor linear attention
# (feature width 16) in the first block, sliding-window attention (64 tokens) in the second.
BASED = ('linear+local', (('feature_map', 'taylor'), ('qk_dim', 16), ('window', 64)))
SEEDS = (0, 1)
# Line styles, one per budget or seed: seven that matplotlib draws apart.
STYLES = ('-', '--', ':', '-.', (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)))


def label(config) -> str:
  """The mechanism's name, with each attention option set away from its declared default
  ('deltanet conv_size=0') and a head count off configs/mqar.py's ('softmax heads=4');
  block and chunk sizes, which the config fits to the length (`common.fit_blocks`), and
  unset options (None) are not named."""
  mechanism = config.attention.mechanism
  declared = hybrid.option_defaults(mechanism)
  changed = hybrid.off_defaults(
    mechanism,
    {
      k: v
      for k, v in config.attention.options.items()
      if k in declared and k not in common.BLOCK_OPTIONS and v is not None
    },
  )
  extra = ['rotary'] if config.attention.get('rotary') else []
  heads = config.model.num_heads
  extra += [f'heads={heads}'] if heads != mqar.DEFAULTS['num_heads'] else []
  return ' '.join([row_label(mechanism, changed)] + extra)


def row_label(mechanism: str, options: Dict[str, Any]) -> str:
  """'mechanism key=value ...', the options sorted: a row's name (`label`, `plan`)."""
  return ' '.join([mechanism] + [f'{k}={v}' for k, v in sorted(options.items())])


def read_run(workdir: str) -> Dict[str, Any]:
  """One finished run's facts, or {} when it is not finished."""
  results_path = os.path.join(workdir, 'results.json')
  config = api.stored_config(workdir)
  if config is None or not os.path.exists(results_path):
    return {}
  with open(results_path) as f:
    results = json.load(f)
  if results['steps'] < config.train.num_steps:
    return {}
  return dict(
    workdir=workdir,
    mechanism=label(config),
    width=config.model.d_model,
    seq_len=config.dataset.max_length,
    num_kv_pairs=config.dataset.num_kv_pairs,
    vocab_size=config.dataset.vocab_size,
    seed=config.train.seed,
    steps=results['steps'],
    learning_rate=config.optim.learning_rate,
    accuracy=results['eval_accuracy'],
    loss=results['eval_loss'],
    train_accuracy=results['train_accuracy'],
    examples_per_sec=results['steady_examples_per_sec'],
    device=results.get('device', ''),  # '' before results.json named it
    params=results['params_total'],
    curve=train_curve(workdir),
    config=config,
  )


# What a report's .json keeps of each run (`read_run` less its config, plus its state).
RUN_FIELDS = (
  'workdir',
  'mechanism',
  'width',
  'seq_len',
  'num_kv_pairs',
  'vocab_size',
  'seed',
  'steps',
  'learning_rate',
  'accuracy',
  'loss',
  'train_accuracy',
  'examples_per_sec',
  'params',
  'state_bytes',
  'curve',
)
OPTIONAL_FIELDS = ('device',)  # kept when known: reports written before it have none


def run_key(r: Dict[str, Any]) -> tuple:
  """What makes two runs the same run: mechanism, width, cell, budget and seed."""
  return (
    r['mechanism'],
    r['width'],
    r['seq_len'],
    r['num_kv_pairs'],
    r['vocab_size'],
    r['learning_rate'],
    r['steps'],
    r['seed'],
  )


def read_report(path: str) -> List[Dict[str, Any]]:
  """The runs an earlier report was made of: its `runs`, or, from a report that has only
  `rows`, one run per row and seed (the row's throughput, no loss, no curve). A file that is
  not such a report is a one-line exit naming it."""
  data = runs_io.read_report(path)
  runs, rows = (data.get('runs'), data.get('rows')) if isinstance(data, dict) else (None, None)
  if isinstance(runs, list) and all(
    isinstance(r, dict) and set(RUN_FIELDS) <= set(r) for r in runs
  ):
    return [dict(r) for r in runs]
  per_row = (
    'mechanism',
    'width',
    'seq_len',
    'num_kv_pairs',
    'vocab_size',
    'steps',
    'learning_rate',
    'examples_per_sec',
    'params',
    'state_bytes',
  )
  per_seed = ('seeds', 'accuracy', 'train_accuracy', 'workdirs')
  if (
    runs is not None
    or not isinstance(rows, list)
    or not all(isinstance(r, dict) and set(per_row + per_seed) <= set(r) for r in rows)
  ):
    raise SystemExit(
      f'{path}: not a report JSON (it has neither a "runs" list with '
      f'{", ".join(RUN_FIELDS)} nor a "rows" list of seed groups)'
    )
  return [
    dict(
      {k: row[k] for k in per_row},
      workdir=workdir,
      seed=seed,
      accuracy=acc,
      train_accuracy=train,
      loss=None,
      curve=None,
    )
    for row in rows
    for seed, acc, train, workdir in zip(*(row[k] for k in per_seed))
  ]


def merge(stored: List[Dict[str, Any]], read: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """`stored` runs (from reports) with `read` runs (from workdirs) added; a read run replaces
  a stored run with the same `run_key`."""
  runs = {run_key(r): r for r in stored}
  runs.update((run_key(r), r) for r in read)
  return [runs[k] for k in sorted(runs)]


def with_state(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Each run read from a workdir with its `state_bytes`, computed from its config once per
  mechanism, width and cell."""
  cache: Dict[tuple, Optional[int]] = {}

  def state(r):
    key = (r['mechanism'], r['width'], r['seq_len'], r['num_kv_pairs'])
    if key not in cache:
      cache[key] = state_bytes(r['config'])
    return cache[key]

  return [dict(r, state_bytes=state(r)) for r in runs]


def mqar_config(arg: str):
  """configs/mqar.py's config for `arg` ('mechanism,key=value,...')."""
  return api.config_function('configs/mqar.py')(arg)


def state_bytes(config) -> Optional[int]:
  """Bytes of one sequence's decode cache for the model of `config` (no weights read), or
  None for a mechanism without a decoding form."""
  if not all(d.decode for d in hybrid.declarations(config.attention.mechanism)):
    return None
  model = api.create_model(config)
  params = jax.eval_shape(
    lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, config.dataset.max_length), jnp.int32))[
      'params'
    ]
  )
  return cache_bytes(model, params)


def plan() -> List[Dict[str, Any]]:
  """The study's runs, as `run_key` reads them: the sweep's mechanisms (softmax, linear
  attention and the gated and delta-rule four) and Based's hybrid (BASED) at every width and
  cell of GRID, and every other mechanism with a causal form at ONE_CELL, each for every
  seed of SEEDS, at the sweep's default budget (vocabulary, learning rate, steps). Ordered
  by width, cell and mechanism, a mechanism's seeds together. A run with sweep settings
  beyond its mechanism (BASED's options) has them in 'settings' ('key=value;...')."""
  d = sweep.DEFAULTS
  core = [(m, ()) for m in d['mechanisms']] + [BASED]
  others = [(m, ()) for m in registry.names_where(lambda m: m.causal) if m not in d['mechanisms']]
  cells = [(m, w, l, p) for w, l, p in GRID for m in core] + [(m,) + ONE_CELL for m in others]
  return [
    dict(
      mechanism=row_label(m, dict(options)),
      settings=';'.join(f'{k}={v}' for k, v in options),
      width=w,
      seq_len=l,
      num_kv_pairs=p,
      vocab_size=d['vocab_size'],
      learning_rate=d['learning_rate'],
      steps=d['num_steps'],
      seed=s,
    )
    for (m, options), w, l, p in cells
    for s in SEEDS
  ]


def missing(
  runs: List[Dict[str, Any]], mechanisms: Sequence[str] = (), widths: Sequence[int] = ()
) -> List[str]:
  """The runs of `plan()` (of these mechanisms and widths, if named) that `runs` lack, as
  'seed:mechanism:width:cell[:settings]' (studies/recall/gpu/run.sh's form; settings
  'key=value;...', the sweep's, for a run that has them: BASED)."""
  have = {run_key(r) for r in runs}
  return [
    f'{r["seed"]}:{r["mechanism"].split()[0]}:{r["width"]}:'
    f'{r["seq_len"]}x{r["num_kv_pairs"]}' + (f':{r["settings"]}' if r['settings'] else '')
    for r in select(plan(), mechanisms, widths)
    if run_key(r) not in have
  ]


def select(
  runs: List[Dict[str, Any]],
  mechanisms: Sequence[str] = (),
  widths: Sequence[int] = (),
  budget: Optional[tuple] = None,
) -> List[Dict[str, Any]]:
  """The runs of these mechanisms (by name, whatever their options), widths and budget
  ((steps, learning_rate, vocab_size)); an empty list or None keeps every one."""
  return [
    r
    for r in runs
    if (not mechanisms or r['mechanism'].split()[0] in mechanisms)
    and (not widths or r['width'] in widths)
    and (budget is None or (r['steps'], r['learning_rate'], r['vocab_size']) == budget)
  ]


def legend_label(label: str) -> str:
  """A row's label for a legend: its options below its mechanism, a few to a line."""
  return textwrap.fill(label, width=24, break_long_words=False)


def group(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Runs (with their `state_bytes`) grouped by (mechanism, width, seq_len, num_kv_pairs) and
  budget (vocabulary, learning rate, steps): mean and spread over seeds."""
  groups: Dict[tuple, List[Dict[str, Any]]] = {}
  for r in runs:
    groups.setdefault(
      (
        r['mechanism'],
        r['width'],
        r['seq_len'],
        r['num_kv_pairs'],
        r['vocab_size'],
        r['learning_rate'],
        r['steps'],
      ),
      [],
    ).append(r)
  rows = []
  for (mechanism, width, seq_len, pairs, _, _, _), members in groups.items():
    members.sort(key=lambda r: r['seed'])
    acc = [float(r['accuracy']) for r in members]
    mean, spread = runs_io.mean_spread(acc)
    rows.append(
      dict(
        mechanism=mechanism,
        width=width,
        seq_len=seq_len,
        num_kv_pairs=pairs,
        seeds=[r['seed'] for r in members],
        accuracy=acc,
        mean=mean,
        spread=spread,
        train_accuracy=[float(r['train_accuracy']) for r in members],
        examples_per_sec=float(np.mean([r['examples_per_sec'] for r in members])),
        examples_per_sec_each=[float(r['examples_per_sec']) for r in members],
        devices=[r.get('device') or '' for r in members],
        params=members[0]['params'],
        steps=members[0]['steps'],
        vocab_size=members[0]['vocab_size'],
        learning_rate=members[0]['learning_rate'],
        state_bytes=members[0]['state_bytes'],
        workdirs=[r['workdir'] for r in members],
      )
    )
  rows.sort(key=lambda r: (r['seq_len'], r['num_kv_pairs'], r['width'], -r['mean']))
  return rows


def _bytes(n: Optional[int]) -> str:
  return 'no decoding form' if n is None else f'{n:,}'


def _device(name: str) -> str:
  """'NVIDIA H100 80GB HBM3' -> 'H100'; '' (not recorded) and 'cpu' -> 'cpu'."""
  if name.startswith('NVIDIA '):
    return name.split()[1]
  return name or 'cpu'


def throughput(r: Dict[str, Any]) -> str:
  """A row's examples/s: the seeds' mean, its device named unless a CPU ('' = a run from
  before results.json named its device: in this study, one CPU core); each seed's with
  its device when they ran on different devices."""
  devices = [_device(d) for d in r.get('devices') or [''] * len(r['seeds'])]
  if len(set(devices)) == 1:
    return f"{r['examples_per_sec']:,.0f}" + ('' if devices[0] == 'cpu' else f' ({devices[0]})')
  return ', '.join(f'{e:,.0f} ({d})' for e, d in zip(r['examples_per_sec_each'], devices))


def budget(r: Dict[str, Any]) -> str:
  """A run's or row's budget: '1000 steps, lr 0.01, vocab 1024'."""
  return f"{r['steps']} steps, lr {r['learning_rate']:g}, vocab {r['vocab_size']}"


def count_budgets(rows: List[Dict[str, Any]]) -> int:
  """How many budgets the runs or rows hold."""
  return len({budget(r) for r in rows})


def name(r: Dict[str, Any], budgets: int) -> str:
  """The mechanism, with its budget when the report holds more than one."""
  return r['mechanism'] + (f' ({budget(r)})' if budgets > 1 else '')


def markdown(rows: List[Dict[str, Any]], command: str) -> str:
  """The table; a 'budget' column when the rows hold more than one budget."""
  several = count_budgets(rows) > 1
  extra = (' budget |', '---|') if several else ('', '')
  lines = [
    f'command: `{command}`',
    '',
    '| cell (seq_len, pairs) | width | mechanism |' + extra[0] + ' test accuracy, mean '
    '± spread | seeds | decode state (bytes / sequence) | params | examples/s (one '
    'CPU core, or the device named) |',
    '|:---|---:|:---|' + extra[1] + '---:|:---|---:|---:|---:|',
  ]
  for r in rows:
    seeds = ', '.join(f'{s}: {100 * a:.2f}%' for s, a in zip(r['seeds'], r['accuracy']))
    lines.append(
      f"| ({r['seq_len']}, {r['num_kv_pairs']}) | {r['width']} | {r['mechanism']} "
      + (f'| {budget(r)} ' if several else '')
      + f"| {100 * r['mean']:.2f} ± {100 * r['spread']:.2f}% | {seeds} "
      f"| {_bytes(r['state_bytes'])} | {r['params']:,} | {throughput(r)} |"
    )
  return '\n'.join(lines) + '\n'


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


def plot(rows: List[Dict[str, Any]], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  budgets = count_budgets(rows)
  # One line per mechanism and budget: a colour per mechanism in every panel, so the panels
  # read side by side, and a line style per budget.
  mechanism_colour = colours(rows)
  budget_style = {
    b: STYLES[i % len(STYLES)] for i, b in enumerate(sorted({budget(r) for r in rows}))
  }
  colour = {name(r, budgets): mechanism_colour[r['mechanism']] for r in rows}
  style = {name(r, budgets): budget_style[budget(r)] for r in rows}
  by_cell: Dict[tuple, List[Dict[str, Any]]] = {}
  for r in rows:
    by_cell.setdefault((r['seq_len'], r['num_kv_pairs']), []).append(
      dict(r, mechanism=name(r, budgets))
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


def train_curve(workdir: str):
  """[steps, train accuracy] logged in the run's metrics.jsonl."""
  points = [
    (m['step'], m['accuracy'])
    for m in runs_io.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
    if m.get('split') == 'train' and 'accuracy' in m
  ]
  return [list(x) for x in zip(*sorted(points))] if points else [[], []]


def plot_curves(runs: List[Dict[str, Any]], path: str) -> None:
  """Training accuracy (the logged running mean) against step for every run that has a curve
  (a run given back by a report written before curves were kept has none; the title counts
  them): a panel per width and cell (and budget, when the drawn runs have several), a colour
  per mechanism (as in `plot`), a line style per seed, one legend for the figure."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import lines as mlines  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  drawn = [r for r in runs if r.get('curve') and r['curve'][0]]
  budgets = count_budgets(drawn)
  colour = colours(runs)

  def panel(r):
    return (r['width'], r['seq_len'], r['num_kv_pairs']) + ((budget(r),) if budgets > 1 else ())

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
    (budget(drawn[0]) if budgets == 1 else 'training accuracy')
    + (f'; {missing} of {len(runs)} runs have no stored curve' if missing else ''),
    fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches='tight')


def plot_state(rows: List[Dict[str, Any]], path: str) -> None:
  """Accuracy against decode state per sequence (log scale), as Zoology's recall-memory plot:
  a colour per mechanism (as in `plot`), a marker per cell, a line through one mechanism's
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
  budgets = sorted({budget(r) for r in drawn})
  budget_style = {b: STYLES[i % len(STYLES)] for i, b in enumerate(budgets)}
  fig, ax = plt.subplots(figsize=(7, 4.5))
  lines: Dict[tuple, List[Dict[str, Any]]] = {}
  for r in drawn:
    lines.setdefault((r['mechanism'], r['seq_len'], r['num_kv_pairs'], budget(r)), []).append(r)
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


def state_table() -> str:
  """Markdown: bytes per sequence of every causal mechanism's decode state over `GRID`."""
  lines = [
    '| mechanism | ' + ' | '.join(f'width {w}, ({n}, {k})' for w, n, k in GRID) + ' |',
    '|:---|' + '---:|' * len(GRID),
  ]
  for m in registry.names_where(lambda d: d.causal):
    cells = [
      state_bytes(mqar_config(f'{m},d_model={w},seq_len={n},num_kv_pairs={k}')) for w, n, k in GRID
    ]
    lines.append(f'| `{m}` | ' + ' | '.join(_bytes(c) for c in cells) + ' |')
  return '\n'.join(lines) + '\n'


def selection(mechanisms: Sequence[str], widths: Sequence[str], budget: str = ''):
  """(mechanisms, widths, budget) from --mechanisms, --widths and --budget (None when not
  given); a one-line exit naming a bad value."""
  unknown = [m for m in mechanisms if hybrid.unregistered(m)]
  if unknown:
    sys.exit(
      f'--mechanisms: {", ".join(unknown)} not registered; valid choices: '
      f'{", ".join(registry.list_mechanisms())}, or several joined by '
      f'{hybrid.SEPARATOR!r}'
    )
  bad = [w for w in widths if not w.isdigit() or int(w) < 1]
  if bad:
    sys.exit(f'--widths: {", ".join(bad)} is not a positive integer')
  return list(mechanisms), [int(w) for w in widths], parse_budget(budget) if budget else None


def parse_budget(text: str) -> tuple:
  """'4000,1e-3,1024' -> (4000, 0.001, 1024); a one-line exit for anything else."""
  parts = text.split(',')
  try:
    steps, learning_rate, vocab_size = int(parts[0]), float(parts[1]), int(parts[2])
    if len(parts) != 3 or min(steps, vocab_size) < 1 or not learning_rate > 0:
      raise ValueError
  except (ValueError, IndexError):
    sys.exit(
      f'--budget: {text!r} is not steps,learning_rate,vocab_size (positive numbers, '
      f'e.g. 4000,1e-3,1024)'
    )
  return steps, learning_rate, vocab_size


def missing_report(
  sources: Sequence[str],
  mechanisms: Sequence[str] = (),
  widths: Sequence[int] = (),
  budget: Optional[tuple] = None,
):
  """--missing: (what the list is, with the commands that run it; the runs of `plan()` that
  `sources` lack, as `missing` gives them). A budget other than the sweep's, or a source
  that is no .json and matches no folder, is a one-line exit naming it."""
  d = sweep.DEFAULTS
  if budget not in (None, (d['num_steps'], d['learning_rate'], d['vocab_size'])):
    sys.exit(
      f'--budget={",".join(f"{x:g}" for x in budget)} with --missing: the plan is at '
      f'the sweep\'s budget; valid: --budget={d["num_steps"]},{d["learning_rate"]:g},'
      f'{d["vocab_size"]} or none'
    )
  empty = [
    a
    for a in sources
    if not a.endswith('.json') and not any(os.path.isdir(f) for f in glob.glob(a))
  ]
  if empty:
    sys.exit(
      f'--missing: {", ".join(empty)} names no folder; valid sources: a report\'s '
      f'.json or folders of workdirs'
    )
  lost = missing(read_runs(sources, state=False), mechanisms, widths)
  header = (
    f'{len(lost)} of the plan\'s {len(select(plan(), mechanisms, widths))} runs '
    f'(vocabulary {d["vocab_size"]:,}, learning rate {d["learning_rate"]:g}, '
    f'{d["num_steps"]:,} steps; seeds {", ".join(map(str, SEEDS))}) are not in '
    f'{" ".join(sources) or "(no sources)"}'
    + (
      ': run them on a GPU with `OUT=<folder> bash studies/recall/gpu/run.sh '
      '<these>`, or one on a CPU with `python -m train.sweep '
      '--sweep=studies/recall/sweep.py:seed=<s>,mechanisms=<m>,widths=<w>,'
      'cells=<cell>[,<settings, ";" as ",">] --root=<root>/seed<s> run`'
      if lost
      else ''
    )
  )
  return header, lost


def main(argv):
  if _STATES.value:
    table = (
      f'command: `python -m studies.recall.report --states --out={_OUT.value} '
      f'--name={_NAME.value}`\n\n' + state_table()
    )
    with open(os.path.join(_OUT.value, _NAME.value + '_states.md'), 'w') as f:
      f.write(table)
    print(table)
    return
  mechanisms, widths, budget = selection(
    _MECHANISMS.value,
    _WIDTHS.value,  # before any work
    _BUDGET.value,
  )
  if _MISSING.value:
    header, lost = missing_report(argv[1:], mechanisms, widths, budget)
    print(header, file=sys.stderr)
    tools.emit('\n'.join(lost))
    return
  # The command as a record names it: a workdir outside the checkout relative to it.
  command = 'python -m studies.recall.report ' + ' '.join(
    [f"'{hygiene.portable(a)}'" for a in argv[1:]]
    + [f'--{f.name}={",".join(map(str, f.value))}' for f in (_MECHANISMS, _WIDTHS) if f.value]
    + ([f'--budget={_BUDGET.value}'] if _BUDGET.value else [])
    + [f'--out={_OUT.value}', f'--name={_NAME.value}']
  )
  rows = write_report(
    argv[1:], os.path.join(_OUT.value, _NAME.value), command, mechanisms, widths, budget
  )['rows']
  print(markdown(rows, command))


def read_runs(sources: Sequence[str], state: bool = True) -> List[Dict[str, Any]]:
  """The finished runs of `sources` (earlier reports' .json, and folder globs of workdirs),
  a workdir's replacing a report's of the same `run_key`; `state`: a workdir's run gets its
  decode state (its model built from its config: seconds per mechanism, width and cell)."""
  stored = [r for path in sources if path.endswith('.json') for r in read_report(path)]
  folders = sorted(
    {
      d
      for pattern in sources
      if not pattern.endswith('.json')
      for d in glob.glob(pattern)
      if os.path.isdir(d)
    }
  )
  workdirs = sorted(
    {
      os.path.join(f, d)
      for f in folders
      for d in os.listdir(f)
      if os.path.isdir(os.path.join(f, d))
    }
  )
  read = [r for r in (read_run(w) for w in workdirs) if r]
  read = with_state(read) if state else [dict(r, state_bytes=None) for r in read]
  return merge(stored, [{k: r[k] for k in RUN_FIELDS + OPTIONAL_FIELDS if k in r} for r in read])


def write_report(
  sources: Sequence[str],
  base: str,
  command: str,
  mechanisms: Sequence[str] = (),
  widths: Sequence[int] = (),
  budget: Optional[tuple] = None,
) -> Dict[str, Any]:
  """Reads the runs of `sources` (earlier reports' .json, and folder globs of workdirs) and
  writes <base>.json, .md, .png, _state.png and _curves.png; returns the .json's content."""
  runs = select(read_runs(sources), mechanisms, widths, budget)
  if not runs:
    sys.exit(f'no finished runs under {list(sources)}')
  data = dict(command=command, rows=group(runs), runs=runs)
  os.makedirs(os.path.dirname(base) or '.', exist_ok=True)
  with open(base + '.json', 'w') as f:
    json.dump(data, f, indent=1)
  with open(base + '.md', 'w') as f:
    f.write(markdown(data['rows'], command))
  plot(data['rows'], base + '.png')
  plot_state(data['rows'], base + '_state.png')
  plot_curves(runs, base + '_curves.png')
  return data


if __name__ == '__main__':
  app.run(main)

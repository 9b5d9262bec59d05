r"""The recall study's report: accuracy per mechanism, width and cell over seeds, with the
decode state.

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
from typing import Any, Dict, Optional, Sequence

from absl import app
from absl import flags

from benchmarks import common as tools
from efficient_attn import registry
from efficient_attn.layers import hybrid
from studies import hygiene
from studies.recall import plots
from studies.recall import run_records
from studies.recall import study_plan
from studies.recall import sweep
from studies.recall import tables

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


def parse_selection(mechanisms: Sequence[str], widths: Sequence[str], budget: str = ''):
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
  """--missing: (what the list is, with the commands that run it; the runs of `study_plan.plan()`
  that `sources` lack, as `study_plan.missing` gives them). A budget other than the sweep's,
  or a source that is no .json and matches no folder, is a one-line exit naming it."""
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
  lost = study_plan.missing(run_records.read_runs(sources, state=False), mechanisms, widths)
  planned = len(run_records.select(study_plan.plan(), mechanisms, widths))
  header = (
    f'{len(lost)} of the plan\'s {planned} runs '
    f'(vocabulary {d["vocab_size"]:,}, learning rate {d["learning_rate"]:g}, '
    f'{d["num_steps"]:,} steps; seeds {", ".join(map(str, study_plan.SEEDS))}) are not in '
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
      f'--name={_NAME.value}`\n\n' + tables.state_table()
    )
    with open(os.path.join(_OUT.value, _NAME.value + '_states.md'), 'w') as f:
      f.write(table)
    print(table)
    return
  mechanisms, widths, budget = parse_selection(
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
  print(tables.markdown(rows, command))


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
  runs = run_records.select(run_records.read_runs(sources), mechanisms, widths, budget)
  if not runs:
    sys.exit(f'no finished runs under {list(sources)}')
  data = dict(command=command, rows=tables.group(runs), runs=runs)
  os.makedirs(os.path.dirname(base) or '.', exist_ok=True)
  with open(base + '.json', 'w') as f:
    json.dump(data, f, indent=1)
  with open(base + '.md', 'w') as f:
    f.write(tables.markdown(data['rows'], command))
  plots.plot_accuracy(data['rows'], base + '.png')
  plots.plot_state(data['rows'], base + '_state.png')
  plots.plot_curves(runs, base + '_curves.png')
  return data


if __name__ == '__main__':
  app.run(main)

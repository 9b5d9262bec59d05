r"""Experiment workdirs -> one comparison table and learning-curve plots.

Reads each workdir's `results.json` (written when a run finishes),
`metrics.jsonl` (one JSON object per log/eval: step, split, loss, accuracy,
top5_accuracy, ...) and `config.json`. A run without results.json is reported
from its last logged metrics, marked 'running'. Directories that are not workdirs are skipped with a message, so a
glob over a sweep root works. Workdirs may be on gs:// (quote the glob there, the
shell cannot expand it: 'gs://bucket/runs/*').

    python -m benchmarks.report runs/* --out=benchmark_results/report
    python -m benchmarks.report runs/mnist_* --sort=eval_accuracy --name=mnist

Runs whose configs differ only in `train.seed` are also summarised over seeds:
the mean eval accuracy, its spread (half the range), the lowest and highest,
and the mean epoch time and ex/s of the finished runs of each group.

Speed, two quantities under two names:

  * 'ex/s' is the number the trainer prints as 'ex/s' on its last progress line
    (results.json `steady_examples_per_sec`): examples per second over every
    training step after the first (which compiles), evaluation, checkpoint
    saving and metric writing excluded;
  * 'epoch time' is the median time of a whole epoch after the first (the first
    when only one ran), the same excluded; results.json's `examples_per_sec` is
    examples per epoch / that time (the steady rate in a run shorter than an
    epoch). It is kept in the JSON rows, not shown as a column.

An earlier report's JSON may stand in for workdirs that are gone: its rows are
read as they were written (marked with their `source`), and they join the seed
groups. A report written before rows recorded their `config_id` cannot be
matched by config; the groups are then formed from what every row records
(model, dataset, mechanism, projection, heads, d_model, depth, steps, eval
split), and the table says so.

    python -m benchmarks.report old_report.json 'runs/seed1/*' --name=over_seeds

Writes <out>/<name>.json, .md and <name>_curves.png (loss and accuracy against
step, train solid and eval dashed, one colour per run; and eval accuracy over
the second half of each run, zoomed to its range).
"""

import hashlib
import json
import os
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import flags
from etils import epath

from benchmarks import common
from benchmarks import output
from benchmarks import runs

LEFT = ('run', 'dataset', 'mechanism', 'projection', 'h', 'eval split', 'status')
COLUMNS = (  # (key, header, formatter)
  ('run', 'run', str),
  ('dataset', 'dataset', str),
  ('mechanism', 'mechanism', str),
  ('projection', 'projection', str),
  ('heads', 'h', str),
  ('d_model', 'd_model', str),
  ('seed', 'seed', str),
  ('params_total', 'params', lambda v: f'{v:,}'),
  ('params_per_attention_layer', 'params / attn layer', lambda v: f'{v:,}'),
  ('train_accuracy', 'train acc', lambda v: f'{100 * v:.2f}%'),
  ('train_loss', 'train loss', lambda v: f'{v:.4f}'),
  ('eval_split', 'eval split', str),
  ('eval_accuracy', 'eval acc', lambda v: f'{100 * v:.2f}%'),
  ('eval_loss', 'eval loss', lambda v: f'{v:.4f}'),
  ('eval_top5_accuracy', 'eval top-5', lambda v: f'{100 * v:.2f}%'),
  ('epoch_time_s', 'epoch time', lambda v: f'{v:.3g} s'),
  ('steady_examples_per_sec', 'ex/s', lambda v: f'{v:,.0f}'),  # the trainer's 'ex/s'
  ('steps', 'steps', str),
  ('status', 'status', str),
)


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/report', name='report')
  flags.DEFINE_string('sort', '', 'column key to sort by (descending for accuracy)', flag_values=fv)


# What every report row records of its config: the seed groups' key for rows read from a
# report that predates `config_id`.
DESCRIPTION = (
  'model',
  'dataset',
  'mechanism',
  'projection',
  'heads',
  'd_model',
  'depth',
  'steps',
  'eval_split',
)


def is_workdir(path: str) -> bool:
  path = epath.Path(path)
  return path.is_dir() and any((path / f).exists() for f in ('results.json', 'metrics.jsonl'))


def expand(pattern: str) -> List[str]:
  """A workdir, or a glob in its last part, which the shell cannot expand for gs://."""
  parent, _, name = pattern.rstrip('/').rpartition('/')
  if not any(c in name for c in '*?['):
    return [pattern]
  return sorted(os.fspath(p) for p in epath.Path(parent or '.').glob(name))


def last(rows: List[Dict[str, Any]], split: str, key: str) -> Optional[float]:
  for row in reversed(rows):
    if row.get('split') == split and row.get(key) is not None:
      return row[key]
  return None


def summarise_run(workdir: str) -> Dict[str, Any]:
  """One table row: results.json when finished, else the last logged metrics."""
  path = epath.Path(workdir)
  results = runs.read_json(path / 'results.json')
  metrics = runs.read_jsonl(path / 'metrics.jsonl')
  config = runs.read_json(path / 'config.json') or {}
  row = dict(run=path.name, workdir=workdir)
  row.update({k: v for k, v in runs.config_info(config).items() if v is not None})
  if (config.get('train') or {}).get('seed') is not None:
    row['seed'] = config['train']['seed']
  row['config_id'] = config_id(config)
  if results:
    row.update(results)
    row['status'] = 'finished'
  else:
    row['status'] = 'running' if metrics else 'empty'
    for split, prefix in (('train', 'train_'), ('eval', 'eval_')):
      for key in ('loss', 'accuracy', 'top5_accuracy'):
        value = last(metrics, split, key)
        if value is not None:
          row[prefix + key] = value
    for key in ('examples_per_sec', 'epoch_time_s'):
      value = last(metrics, 'train', key)
      if value is not None:
        row[key] = value
    value = last(metrics, 'progress', 'steady_examples_per_sec')  # the last printed ex/s
    if value is not None:
      row['steady_examples_per_sec'] = value
    steps = [m['step'] for m in metrics if 'step' in m]
    if steps:
      row['steps'] = max(steps)
  row['curves'] = curves(metrics)
  return row


def config_id(config: Dict[str, Any]) -> str:
  """A short hash of the config without train.seed: runs sharing it differ only in seed."""
  config = dict(config, train={k: v for k, v in (config.get('train') or {}).items() if k != 'seed'})
  return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def from_report(path: str) -> List[Dict[str, Any]]:
  """The rows of an earlier report's JSON, each marked with its `source`."""
  try:
    data = runs.read_json(path)
  except json.JSONDecodeError as e:
    raise SystemExit(f'{path}: not a report JSON (it does not parse: {e})') from None
  if (
    not isinstance(data, dict)
    or not isinstance(data.get('runs'), list)
    or not all(isinstance(r, dict) and 'run' in r for r in data['runs'])
  ):
    raise SystemExit(f'{path}: not a report JSON (it has no "runs" list of named rows)')
  return [dict(r, source=path) for r in data['runs']]


def seed_groups(rows: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], str]:
  """Finished runs grouped by seedless config, for the groups of two runs or more:
  ([{runs, seeds, n, eval_accuracy mean / spread (half the range) / min / max, mean epoch
  time, mean ex/s (`steady_examples_per_sec_mean`) and mean examples/s by epoch
  (`examples_per_sec_mean`)}], what grouped them: 'config' or the DESCRIPTION fields when a
  row from an older report has no config_id)."""
  finished = [
    r for r in rows if r.get('status') == 'finished' and r.get('eval_accuracy') is not None
  ]
  by_config = all(r.get('config_id') for r in finished)
  groups: Dict[Any, List[Dict[str, Any]]] = {}
  for r in finished:
    key = r['config_id'] if by_config else tuple(str(r.get(k)) for k in DESCRIPTION)
    groups.setdefault(key, []).append(r)
  out = []
  for members in groups.values():
    if len(members) < 2:
      continue
    acc = [r['eval_accuracy'] for r in members]
    acc_mean, acc_spread = runs.mean_spread(acc)
    mean = lambda key: (
      statistics.mean(r[key] for r in members)
      if all(r.get(key) is not None for r in members)
      else None
    )
    names = list(dict.fromkeys(r['run'] for r in members))
    out.append(
      dict(
        runs=names,
        mechanism=members[0].get('mechanism'),
        projection=members[0].get('projection'),
        seeds=[r.get('seed') for r in members],
        n=len(members),
        eval_accuracy_mean=acc_mean,
        eval_accuracy_spread=acc_spread,
        eval_accuracy_min=min(acc),
        eval_accuracy_max=max(acc),
        epoch_time_s_mean=mean('epoch_time_s'),
        examples_per_sec_mean=mean('examples_per_sec'),
        steady_examples_per_sec_mean=mean('steady_examples_per_sec'),
      )
    )
  return out, 'config' if by_config else ', '.join(DESCRIPTION)


def curves(metrics: List[Dict[str, Any]]) -> Dict[str, Dict[str, List[float]]]:
  """{split: {'step': [...], 'loss': [...], 'accuracy': [...]}} from metrics.jsonl rows."""
  out: Dict[str, Dict[str, List[float]]] = {}
  for row in metrics:
    if 'step' not in row or 'split' not in row:
      continue
    c = out.setdefault(row['split'], dict(step=[], loss=[], accuracy=[]))
    c['step'].append(row['step'])
    c['loss'].append(row.get('loss'))
    c['accuracy'].append(row.get('accuracy'))
  return out


def sort_rows(rows, key: str):
  if not key:
    return rows
  descending = 'accuracy' in key or key in ('examples_per_sec', 'steady_examples_per_sec')
  present = [r for r in rows if r.get(key) is not None]
  missing = [r for r in rows if r.get(key) is None]
  return sorted(present, key=lambda r: r[key], reverse=descending) + missing


def markdown(meta, rows, groups, grouped_by='config') -> str:
  notes = [
    'accuracy and loss: final train (mean over the last logging window) and eval '
    "values from results.json, on the split named in 'eval split' (a validation split "
    'carved from the training data is not a test set); runs still going show their last logged '
    "metrics ('running').",
    "ex/s: the trainer's own 'ex/s', its last progress line's (results.json "
    'steady_examples_per_sec): examples per second over every training step after the '
    'first (which compiles), evaluation, checkpoint saving and metric writing excluded. '
    'epoch time: the median whole epoch after the first, the same excluded.',
  ]
  table_rows = []
  for r in rows:
    table_rows.append([None if r.get(k) is None else fmt(r[k]) for k, _, fmt in COLUMNS])
  parts = [
    output.header('Experiment comparison', meta['device_line'], notes, label='Report written on'),
    output.table(
      [h for _, h, _ in COLUMNS],
      table_rows,
      ''.join('l' if h in LEFT else 'r' for _, h, _ in COLUMNS),
    ),
    '',
  ]
  if groups:
    pct = lambda v: f'{100 * v:.2f}%'
    title = (
      'finished runs whose configs differ only in train.seed'
      if grouped_by == 'config'
      else f'finished runs alike in {grouped_by}: a report among the inputs predates '
      'config_id, so configs could not be compared whole'
    )
    parts += [
      f'## Over seeds ({title})',
      '',
      output.table(
        [
          'run',
          'mechanism',
          'projection',
          'seeds',
          'eval acc mean',
          'spread',
          'lowest',
          'highest',
          'epoch time (mean)',
          'ex/s (mean)',
        ],
        [
          [
            ', '.join(g['runs']),
            g['mechanism'],
            g['projection'],
            ', '.join('?' if s is None else str(s) for s in g['seeds']),
            pct(g['eval_accuracy_mean']),
            f'±{100 * g["eval_accuracy_spread"]:.2f}',
            pct(g['eval_accuracy_min']),
            pct(g['eval_accuracy_max']),
            None if g['epoch_time_s_mean'] is None else f'{g["epoch_time_s_mean"]:.3g} s',
            None
            if g['steady_examples_per_sec_mean'] is None
            else f'{g["steady_examples_per_sec_mean"]:,.0f}',
          ]
          for g in groups
        ],
        'lllrrrrrrr',
      ),
      '',
    ]
  return '\n'.join(parts)


def points(curve: Optional[Dict[str, List[float]]], key: str) -> List[Tuple[float, float]]:
  """(step, value) of one curve where `key` was logged."""
  if not curve:
    return []
  return [(s, v) for s, v in zip(curve['step'], curve[key]) if v is not None]


def late_eval(curve: Optional[Dict[str, List[float]]]) -> List[Tuple[float, float]]:
  """(step, eval accuracy) over the second half of a run's evaluated steps."""
  pts = points(curve, 'accuracy')
  if not pts:
    return []
  half = pts[-1][0] / 2
  return [p for p in pts if p[0] > half]


def plot(path: str, rows) -> Optional[str]:
  """Loss (log) and accuracy against step, plus eval accuracy over the second half of each
  run, zoomed to its range: differences of a tenth of a point are visible there."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  if not any(r.get('curves') for r in rows):
    return None
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.4))
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  late = []
  for i, r in enumerate(rows):
    color = colors[i % len(colors)]
    seed = f", seed {r['seed']}" if r.get('seed') is not None else ''
    label = f"{r['run']} ({r.get('mechanism', '?')}/{r.get('projection', '?')}{seed})"
    run_curves = r.get('curves') or {}  # a row from an older report may have none
    for ax, key in zip(axes, ('loss', 'accuracy')):
      for split, style in (('train', '-'), ('eval', '--')):
        pts = points(run_curves.get(split), key)
        if pts:
          ax.plot(
            *zip(*pts),
            style,
            color=color,
            marker='o' if split == 'eval' else None,
            markersize=3,
            label=f'{label} {split}',
          )
    pts = late_eval(run_curves.get('eval'))
    if pts:
      axes[2].plot(*zip(*pts), '--', color=color, marker='o', markersize=3)
      late += [v for _, v in pts]
  for ax, key in zip(axes, ('loss', 'accuracy')):
    ax.set_xlabel('training step')
    ax.set_ylabel(key)
    ax.set_title(f'{key} (train solid, eval dashed)', fontsize=10)
    ax.grid(True, alpha=0.3)
  axes[0].set_yscale('log')
  axes[1].legend(fontsize=7, loc='lower right')
  axes[2].set_xlabel('training step')
  axes[2].set_ylabel('eval accuracy')
  axes[2].set_title('eval accuracy, second half of each run (zoomed)', fontsize=10)
  axes[2].grid(True, alpha=0.3)
  if late:
    pad = max(0.1 * (max(late) - min(late)), 0.002)
    axes[2].set_ylim(min(late) - pad, max(late) + pad)
  return output.save_figure(fig, path)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args, workdirs = common.parse_flags(define_flags, argv, __doc__, positional='workdirs')
  workdirs = [w for pattern in workdirs for w in expand(pattern)]
  info = common.device_info()
  rows = []
  for wd in workdirs:
    if wd.endswith('.json') and epath.Path(wd).is_file():
      rows += from_report(wd)
      continue
    if not is_workdir(wd):
      if not args.quiet:
        print(f'[report] skipping {wd}: no results.json or metrics.jsonl')
      continue
    rows.append(summarise_run(wd))
  if not rows:
    raise SystemExit('no experiment workdirs or report JSON among: ' + ' '.join(workdirs))
  rows = sort_rows(rows, args.sort)
  meta = dict(
    device=info,
    device_line=common.describe_device(info),
    workdirs=workdirs,
    command=output.command('benchmarks.report', argv),
  )
  png = plot(os.path.join(args.out, f'{args.name}_curves.png'), rows)
  groups, grouped_by = seed_groups(rows)
  data = dict(
    meta=meta, runs=rows, seed_groups=groups, seed_groups_by=grouped_by, plots=[png] if png else []
  )
  output.finish(
    args.out, args.name, data, markdown(meta, rows, groups, grouped_by), quiet=args.quiet
  )
  return data


if __name__ == '__main__':
  main()

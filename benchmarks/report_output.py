"""benchmarks.report's output: the comparison table, the table over seeds and the learning
curves."""

from typing import Dict, List, Optional, Tuple

from benchmarks import output

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


def plot_curves(path: str, rows) -> Optional[str]:
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

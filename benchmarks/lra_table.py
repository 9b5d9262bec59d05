r"""Long Range Arena Table 1 from workdirs: accuracy per mechanism and task, LRA's published beside.

    python -m benchmarks.lra_table runs/lra/* --out=docs/results --name=lra
    python -m benchmarks.lra_table 'gs://bucket/lra/*' --out=benchmark_results/lra

Reads each workdir's `config.json` and `results.json` (finished runs; others
are listed as unfinished). The task comes from the config: ListOps, Pathfinder
(generated here), Text (byte-level IMDB), Image (CIFAR-10 pixel tokens) or
Retrieval (LRA's AAN files, which cannot be generated). A row is a
mechanism (with its projection when not 'standard'), a cell its accuracy on the
run's evaluation split, in percent; where several runs share a cell (seeds)
their mean is shown with the count. The setting of each task (examples, length,
model size) is listed, since a `small` run is not LRA's setting.

LRA's published Table 1 (Tay et al. 2021; the leaderboard of
google-research/long-range-arena, 8 November 2020) is printed beside ours for
the mechanisms both have, marked as published. Writes <out>/<name>.json, .md
and <name>.png (both tables as heatmaps).
"""

import statistics
from typing import Any, Dict, List, Optional, Sequence

from absl import flags
from etils import epath

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import report_rows
from benchmarks import runs

TASKS = ('ListOps', 'Text', 'Retrieval', 'Image', 'Pathfinder')
# LRA's Table 1 (test accuracy, %): ListOps, Text, Retrieval, Image, Pathfinder.
PUBLISHED = {
  'local': ('Local Attention', (15.82, 52.98, 53.39, 41.46, 66.63)),
  'linear': ('Linear Trans.', (16.13, 65.90, 53.09, 42.34, 75.30)),
  'reformer': ('Reformer', (37.27, 56.10, 53.40, 38.07, 68.50)),
  'sparse': ('Sparse Trans.', (17.07, 63.58, 59.59, 44.24, 71.71)),
  'sinkhorn': ('Sinkhorn Trans.', (33.67, 61.20, 53.83, 41.23, 67.45)),
  'linformer': ('Linformer', (35.70, 53.94, 52.27, 38.56, 76.34)),
  'performer': ('Performer', (18.01, 65.40, 53.82, 42.77, 77.05)),
  'synthesizer': ('Synthesizer', (36.99, 61.68, 54.67, 41.61, 69.45)),
  'longformer': ('Longformer', (35.63, 62.85, 56.89, 42.22, 69.71)),
  'softmax': ('Transformer', (36.37, 64.27, 57.46, 42.44, 71.40)),
  'bigbird': ('BigBird', (36.05, 64.02, 59.29, 40.83, 74.87)),
}
# The Avg column as printed in the paper's Table 1. Sinkhorn's 51.39 is not the mean of its
# row (51.48); the repository's leaderboard prints 51.29.
PUBLISHED_AVG = {
  'local': 46.06,
  'linear': 50.55,
  'reformer': 50.67,
  'sparse': 51.24,
  'sinkhorn': 51.39,
  'linformer': 51.36,
  'performer': 51.41,
  'synthesizer': 52.88,
  'longformer': 53.46,
  'softmax': 54.39,
  'bigbird': 55.01,
}
PUBLISHED_SOURCE = (
  'Tay et al. (2021), Long Range Arena, Table 1 (arXiv:2011.04006; the '
  'same task columns as the leaderboard of '
  'github.com/google-research/long-range-arena, 8 November 2020); test '
  'accuracy, avg as printed in the paper'
)


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/lra', name='lra')


def task_of(config: Dict[str, Any]) -> Optional[str]:
  """The LRA task a run's config trains, or None."""
  d, m = config.get('dataset', {}), config.get('model', {})
  name = d.get('name')
  if name == 'listops':
    return 'ListOps'
  if name == 'pathfinder':
    return 'Pathfinder'
  if name == 'imdb_reviews' and m.get('kind') == 'text':
    return 'Text'
  if name == 'cifar10' and d.get('pixels_as_tokens'):
    return 'Image'
  if name == 'aan':
    return 'Retrieval'
  return None


def setting_of(config: Dict[str, Any], task: str) -> str:
  """A short description of what the run trained: data size, length, model."""
  d, m = config['dataset'], config['model']
  sizes = d.get('sizes') or {}
  parts = []
  if sizes:
    order = [k for k in ('train', 'validation', 'test') if k in sizes]
    order += sorted(k for k in sizes if k not in order)
    parts.append(' / '.join(f'{int(sizes[k]):,} {k}' for k in order))
  if task == 'ListOps':
    parts.append(f"lengths {d.get('min_length', 500)}-{d.get('max_length')}")
  elif task == 'Pathfinder':
    size = d.get('image_size', 32)
    parts.append(f"{size}x{size}, contour length {d.get('contour_length', 14)}")
  elif task == 'Text':
    parts.append(f"{d.get('max_length')} bytes")
  elif task == 'Retrieval':
    parts.append(f"2 x {d.get('max_length')} bytes")
  layers = 'layer' if m['depth'] == 1 else 'layers'
  parts.append(f"{m['depth']} {layers} x {m['d_model']}, {m['num_heads']} heads")
  return ', '.join(parts)


def read_run(workdir: str) -> Optional[Dict[str, Any]]:
  """{task, mechanism, accuracy, ...} of one LRA workdir; None if it is no LRA run."""
  path = epath.Path(workdir)
  config = runs.read_json(path / 'config.json')
  if not config or not task_of(config):
    return None
  task = task_of(config)
  a = config['attention']
  label = a['mechanism'] + (
    '' if a.get('projection', 'standard') == 'standard' else f"+{a['projection']}"
  )
  results = runs.read_json(path / 'results.json')
  return dict(
    workdir=workdir,
    task=task,
    mechanism=a['mechanism'],
    label=label,
    setting=setting_of(config, task),
    eval_split=config['dataset']['eval_split'],
    accuracy=None if results is None else 100 * results['eval_accuracy'],
    steps=None if results is None else results['steps'],
    wall_time_s=None if results is None else results.get('wall_time_s'),
  )


def cells(rows: List[Dict[str, Any]]) -> Dict[str, Dict[str, List[float]]]:
  """{label: {task: [accuracies]}} of the finished runs."""
  out: Dict[str, Dict[str, List[float]]] = {}
  for r in rows:
    if r['accuracy'] is not None:
      out.setdefault(r['label'], {}).setdefault(r['task'], []).append(r['accuracy'])
  return out


def _cell(values: Optional[List[float]]) -> Optional[str]:
  if not values:
    return None
  mean = statistics.fmean(values)
  return f'{mean:.2f}' + (f' ({len(values)})' if len(values) > 1 else '')


def markdown(meta, rows, ours) -> str:
  tasks = [t for t in TASKS if any(t in v for v in ours.values())]
  labels = sorted(ours)
  notes = [
    f"{len([r for r in rows if r['accuracy'] is not None])} finished runs; accuracy "
    f"in % on each run's evaluation split; (n) = mean of n runs.",
    'published: ' + PUBLISHED_SOURCE + '; not measured here.',
    'command: ' + meta['command'],
  ]
  parts = [
    output.header('Long Range Arena: accuracy (Table 1)', meta['device_line'], notes),
    '## Ours',
    '',
    output.table(
      ['mechanism'] + tasks + [_avg_head(tasks)],
      [
        [label]
        + [_cell(ours[label].get(t)) for t in tasks]
        + [_average([ours[label].get(t) for t in tasks])]
        for label in labels
      ],
    ),
    '',
    '### Settings',
    '',
    output.table(
      ['task', 'setting', 'eval split'],
      sorted({(r['task'], r['setting'], r['eval_split']) for r in rows}),
      align='lll',
    ),
    '',
    '## Published (LRA, not measured here)',
    '',
    output.table(
      ['mechanism', 'LRA model'] + list(TASKS) + ['avg'],
      [
        [m, name] + [f'{v:.2f}' for v in values] + [f'{PUBLISHED_AVG[m]:.2f}']
        for m, (name, values) in PUBLISHED.items()
      ],
    ),
  ]
  unfinished = [r['workdir'] for r in rows if r['accuracy'] is None]
  if unfinished:
    parts += ['', 'Unfinished (no results.json): ' + ', '.join(unfinished)]
  return '\n'.join(parts) + '\n'


def _avg_head(tasks: Sequence[str]) -> str:
  """'avg' over LRA's five tasks; otherwise says over which, since LRA's avg is of five."""
  return 'avg' if len(tasks) == len(TASKS) else f'avg of these {len(tasks)}'


def _average(values: Sequence[Optional[List[float]]]) -> Optional[str]:
  means = [statistics.fmean(v) for v in values if v]
  return f'{statistics.fmean(means):.2f}' if means and len(means) == len(values) else None


def plot(path: str, ours) -> Optional[str]:
  tasks = [t for t in TASKS if any(t in v for v in ours.values())]
  labels = sorted(ours)
  if not tasks:
    return None
  nan = float('nan')
  mine = [[statistics.fmean(ours[l][t]) if ours[l].get(t) else nan for t in tasks] for l in labels]
  published = [
    [
      PUBLISHED[l.split('+')[0]][1][TASKS.index(t)] if l.split('+')[0] in PUBLISHED else nan
      for t in tasks
    ]
    for l in labels
  ]
  return output.heatmaps(
    path,
    [('ours', mine, tasks, labels), ('published (LRA)', published, tasks, labels)],
    xlabel='task',
    ylabel='mechanism',
    colorbar='accuracy (%)',
    suptitle='Long Range Arena accuracy',
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args, workdirs = common.parse_flags(define_flags, argv, __doc__, positional='workdirs')
  workdirs = [w for pattern in workdirs for w in report_rows.expand(pattern)]
  rows = []
  for wd in workdirs:
    row = read_run(wd) if epath.Path(wd).is_dir() else None
    if row is None:
      if not args.quiet:
        print(f'[lra_table] skipping {wd}: not a Long Range Arena workdir')
      continue
    rows.append(row)
  if not rows:
    raise SystemExit('no Long Range Arena workdirs among: ' + ' '.join(workdirs))
  info = machine.device_info()
  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
    workdirs=workdirs,
    command=output.command('benchmarks.lra_table', argv),
  )
  ours = cells(rows)
  png = plot(f'{args.out}/{args.name}.png', ours)
  data = dict(
    meta=meta,
    runs=rows,
    ours=ours,
    published=PUBLISHED,
    published_avg=PUBLISHED_AVG,
    published_source=PUBLISHED_SOURCE,
    tasks=TASKS,
    plots=[png] if png else [],
  )
  output.finish(args.out, args.name, data, markdown(meta, rows, ours), quiet=args.quiet)
  return data


if __name__ == '__main__':
  main()

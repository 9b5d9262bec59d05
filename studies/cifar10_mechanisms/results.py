"""The CIFAR-10 study's results table, from real_cifar10_mechanisms_seeds.json
(`python -m studies.tables`)."""

from studies import tables

JSON = 'studies/cifar10_mechanisms/real_cifar10_mechanisms_seeds.json'
QUESTION = 'Which attention mechanism learns a small CIFAR-10 ViT fastest?'
BUDGET = '2 epochs'
NAMES = dict(
  linformer='Linformer',
  performer='Performer',
  softmax='softmax',
  nystrom='Nystrom',
  local='local (window 32)',
  linear='linear (elu+1)',
  rfa='RFA',
)


def _runs():
  """{mechanism: {seed: run}}; the seed-0 runs predate the report's seed field (None)."""
  found = {}
  for r in tables.load(JSON)['runs']:
    found.setdefault(r['mechanism'], {})[r.get('seed') or 0] = r
  return found


def table() -> str:
  runs = _runs()
  order = sorted(runs, key=lambda m: -sum(r['eval_accuracy'] for r in runs[m].values()))
  rows = []
  for m in order:
    seeds = [runs[m][s] for s in sorted(runs[m])]
    rows.append(
      [NAMES.get(m, m), f"{seeds[0]['params_total']:,}"]
      + [tables.pct(r['eval_accuracy']) for r in seeds]
      + [
        tables.pct_spread([r['eval_accuracy'] for r in seeds]),
        ' / '.join(f"{r['steady_examples_per_sec']:.0f}" for r in seeds),
        ' / '.join(f"{r['epoch_time_s']:.0f} s" for r in seeds),
      ]
    )
  note = (
    'Validation accuracy after 2 epochs (702 steps of batch 128) on 5,000 held-out '
    'images; mean ± half the range of the seeds. Speeds compare within a seed only: '
    'each seed ran on one core of a different, shared machine.'
  )
  return (
    tables.md_table(
      [
        'mechanism',
        'parameters',
        'seed 0',
        'seed 1',
        'mean',
        'examples/s, seed 0 / 1',
        'time per epoch, seed 0 / 1',
      ],
      rows,
    )
    + '\n\n'
    + note
  )


def headline() -> str:
  runs = _runs()
  means = {m: sum(r['eval_accuracy'] for r in v.values()) / len(v) for m, v in runs.items()}
  order = sorted(means, key=lambda m: -means[m])
  return ', '.join(f'{NAMES[m].split()[0]} {tables.pct(means[m])}' for m in order)

"""The projection-scheme study's results table, from the 25-epoch report's JSON, the two
15-epoch reports' JSON and the side-by-side speed measurement's (`python -m studies.tables`)."""

from studies import tables

E25 = 'studies/mnist_projections/real_mnist_projections_e25.json'
E15 = (
  'studies/mnist_projections/real_mnist_projections.json',  # seed 0
  'studies/mnist_projections/real_mnist_projections_seed1.json',
)  # seed 1
SPEED = 'studies/mnist_projections/train_speed_mnist_projections.json'
QUESTION = (
  "Do Hosseini & Hosseini (2024)'s three projection schemes match standard attention "
  'with fewer parameters?'
)
BUDGET = '25 epochs'
SCHEMES = ('standard', 'optimised', 'efficient', 'super')
PAPER = dict(standard=0.9812, optimised=0.9843, efficient=0.9827, super=0.9862)  # test accuracy


def _accuracy(paths, seeds=None):
  """{scheme: [validation accuracy per seed]} of the reports at `paths` (one seed per file
  when `seeds` is given, else each run's own seed)."""
  found = {}
  for i, path in enumerate(paths):
    for r in tables.load(path)['runs']:
      seed = seeds[i] if seeds else r['seed']
      found.setdefault(r['projection'], {})[seed] = r['eval_accuracy']
  return {s: [v[k] for k in sorted(v)] for s, v in found.items()}


def means():
  return {s: tables.mean_spread(v)[0] for s, v in _accuracy([E25]).items()}


def table() -> str:
  e25, e15 = _accuracy([E25]), _accuracy(E15, seeds=(0, 1))
  runs = {(r['projection'], r['seed']): r for r in tables.load(E25)['runs']}
  speed = tables.load(SPEED)['points']
  rows = []
  for s in SCHEMES:
    point = speed[f'configs/mnist.py:{s}']
    epoch = tables.mean_spread([runs[s, seed]['epoch_time_s'] for seed in (0, 1)])[0]
    rows.append(
      [s, f"{runs[s, 0]['params_total']:,}"]
      + [tables.pct(a) for a in e25[s]]
      + [
        tables.pct_spread(e25[s]),
        tables.pct_spread(e15[s]),
        f'{epoch:.0f} s',
        f"{1000 * point['step_s']:.0f} ms",
        f"{point['relative_speed']:.2f}x",
        tables.pct(PAPER[s]),
      ]
    )
  note = (
    'Validation accuracy on 6,000 held-out images (one image is 0.017 points); mean ± '
    'half the range of two seeds. Epoch time: the trainer\'s, 25 epochs, each run alone on '
    'a core, mean of the seeds. Step time: the four schemes\' train steps interleaved in '
    'one process (`benchmarks.train_speed`, batch 128, median of 5 rounds), on a core '
    'shared with a training run. The paper reports test accuracy.'
  )
  return (
    tables.md_table(
      [
        'scheme',
        'parameters',
        'seed 0',
        'seed 1',
        'mean, 25 epochs',
        'mean, 15 epochs',
        'epoch time',
        'step time',
        'speed vs standard',
        'paper',
      ],
      rows,
    )
    + '\n\n'
    + note
  )


def headline() -> str:
  m = means()
  speed = tables.load(SPEED)['points']['configs/mnist.py:efficient']['relative_speed']
  return (
    ', '.join(f'{s} {tables.pct(m[s])}' for s in sorted(m, key=lambda s: -m[s]))
    + f'; efficient {speed:.2f}x as fast per step'
  )

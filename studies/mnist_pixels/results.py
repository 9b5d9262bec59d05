"""The causal pixel study's results table, from mnist_pixels_training.json and the two
generation reports' JSON (`python -m studies.tables`)."""

import statistics

from studies import tables

TRAINING = 'studies/mnist_pixels/mnist_pixels_training.json'
GENERATION = {
  0: 'studies/mnist_pixels/mnist_pixels_generation.json',
  1: 'studies/mnist_pixels/mnist_pixels_generation_seed1.json',
}
QUESTION = (
  'Does linear attention, run as an RNN, generate MNIST pixels as well as softmax, and faster?'
)
BUDGET = '500 steps'
# The "Efficient Attention" report's generation of 100 images: seconds, linear and softmax.
PUBLISHED_WALL = dict(linear=33.0, softmax=368.0)


def _training():
  """{mechanism: [run of seed 0, run of seed 1]}."""
  found = {}
  for r in sorted(tables.load(TRAINING)['runs'], key=lambda r: r['seed']):
    found.setdefault(r['mechanism'], []).append(r)
  return found


def _wall(seed: int, mechanism: str) -> float:
  return tables.load(GENERATION[seed])['wall'][mechanism]['100']['time_s']


def _latency_growth(seed: int, mechanism: str) -> float:
  """Per-step latency, median of the last 10% of positions over the first 10%."""
  times = tables.load(GENERATION[seed])['latency'][mechanism]['times_s']
  k = max(1, len(times) // 10)
  return statistics.median(times[-k:]) / statistics.median(times[:k])


def ratios():
  """Softmax's generation time over linear attention's, per seed's weights."""
  return [_wall(s, 'softmax') / _wall(s, 'linear') for s in sorted(GENERATION)]


def table() -> str:
  training = _training()
  rows = []
  for m, runs in training.items():
    bits = [r['bits_per_dim'] for r in runs]
    mean, spread = tables.mean_spread(bits)
    rows.append(
      [m]
      + [f'{b:.3f}' for b in bits]
      + [
        f'{mean:.3f} ± {spread:.3f}',
        tables.pct(runs[0]['pixel_accuracy'], 1),
        ' / '.join(f"{r['examples_per_sec']:.1f}" for r in runs),
        ' / '.join(f"{r['wall_time_s']:,} s" for r in runs),
      ]
    )
  first = tables.md_table(
    [
      'mechanism',
      'bits/dim, seed 0',
      'seed 1',
      'mean ± half range',
      'pixel accuracy',
      'examples/s, seed 0 / 1',
      'wall time, seed 0 / 1',
    ],
    rows,
  )
  gen = tables.load(GENERATION[0])
  wall = [[f'{_wall(s, m):.2f} s' for m in ('linear', 'softmax')] for s in sorted(GENERATION)]
  mean, spread = tables.mean_spread(ratios())
  second = tables.md_table(
    [
      'generating 100 images (784 steps)',
      'linear (RNN state)',
      'softmax (KV cache)',
      'softmax / linear',
    ],
    [
      ['wall time, seed 0 weights'] + wall[0] + [f'{ratios()[0]:.1f}x'],
      ['wall time, seed 1 weights'] + wall[1] + [f'{ratios()[1]:.1f}x'],
      ['mean of the two'] + ['', ''] + [f'{mean:.1f}x ± {spread:.1f}'],
      ['the "Efficient Attention" report']
      + [f'{PUBLISHED_WALL[m]:.0f} s' for m in ('linear', 'softmax')]
      + [f"{PUBLISHED_WALL['softmax'] / PUBLISHED_WALL['linear']:.0f}x"],
      ['per-step latency, last / first 10% (seed 0 / 1)']
      + [
        ' / '.join(f'{_latency_growth(s, m):.2f}x' for s in sorted(GENERATION))
        for m in ('linear', 'softmax')
      ]
      + [''],
      ['decoding state per image']
      + [f"{gen['cache_bytes'][m] / 1024:,.1f} KiB" for m in ('linear', 'softmax')]
      + [''],
    ],
  )
  note = (
    'Validation bits per dimension on 6,000 held-out images after 500 steps of batch 32 '
    '(0.3 epochs). Seed 1 ran on a slower machine; generation ran on one core, both '
    'mechanisms on the same weights (the linear model\'s).'
  )
  return first + '\n\n' + second + '\n\n' + note


def headline() -> str:
  training = _training()
  bits = {
    m: tables.mean_spread([r['bits_per_dim'] for r in runs])[0] for m, runs in training.items()
  }
  mean, _ = tables.mean_spread(ratios())
  return (
    f"{bits['linear']:.3f} vs {bits['softmax']:.3f} bits/dim (linear, softmax); softmax "
    f'takes {mean:.1f}x as long to generate 100 images'
  )

"""The recall study's learning-rate sweep table: the best peak rate per mechanism, as
Zoology reports it, beside each rate's seed-0 accuracy.

Every run is width 64, (128, 8), 4,000 steps, vocabulary 1,024 (budget D but for the rate).
The sweep picks each mechanism's rate on seed 0 (ties go to the lower rate, the grid's
1e-3 first); the mean is over the seeds run at that rate. A mechanism is named by its
current defaults, so Gated DeltaNet is fla's initialisation and Mamba-2 has its convolution
bias: neither is the grid's row of the same name (`results.GDN_TORCH`, `MAMBA2_GRID`).
"""

from typing import Dict, List, Optional, Tuple

from studies import tables

RATES = (1e-3, 3e-3, 1e-2)
CELL = (64, 128, 8)  # width, seq_len, pairs
STEPS, VOCAB = 4000, 1024
SWEPT = ('softmax', 'deltanet', 'gated_deltanet', 'mamba2', 'gla', 'linear')
NAMES = {
  'softmax': 'softmax',
  'deltanet': 'DeltaNet',
  'gated_deltanet': "Gated DeltaNet (fla's init)",
  'mamba2': 'Mamba-2 (conv bias)',
  'gla': 'GLA',
  'linear': 'linear',
}


def rate_name(rate: float) -> str:
  """0.003 -> '3e-3'."""
  mantissa, exponent = f'{rate:.0e}'.split('e')
  return f'{mantissa}e{int(exponent)}'


def _row(found: Dict[tuple, dict], label: str, rate: float) -> Optional[dict]:
  return found.get((label, *CELL, (STEPS, rate, VOCAB)))


def _seed0(row: Optional[dict]) -> Optional[float]:
  if row is None or 0 not in row['seeds']:
    return None
  return row['accuracy'][row['seeds'].index(0)]


def best_rate(found: Dict[tuple, dict], label: str) -> Tuple[Optional[float], Optional[dict]]:
  """(rate, row) of the highest seed-0 accuracy among RATES, the lower rate on a tie;
  (None, None) until a rate has a seed-0 run."""
  best: Tuple[Optional[float], Optional[dict]] = (None, None)
  for rate in RATES:
    row = _row(found, label, rate)
    accuracy = _seed0(row)
    if accuracy is not None and (best[1] is None or accuracy > _seed0(best[1])):
      best = (rate, row)
  return best


def ranking(found: Dict[tuple, dict], at_best: bool) -> List[str]:
  """The swept mechanisms' labels by mean accuracy, at 1e-3 or at each one's best rate
  (a mechanism without that run is left out)."""
  means = {}
  for label in SWEPT:
    row = best_rate(found, label)[1] if at_best else _row(found, label, RATES[0])
    if row is not None:
      means[label] = row['mean']
  return sorted(means, key=lambda label: -means[label])


def table(found: Dict[tuple, dict]) -> str:
  """Markdown: a row per swept mechanism."""
  lines = []
  for label in SWEPT:
    rate, row = best_rate(found, label)
    seeds = '-' if row is None else ', '.join(f'{100 * a:.2f}' for a in row['accuracy'])
    lines.append(
      [NAMES[label]]
      + [tables.pct(_seed0(_row(found, label, r))) for r in RATES]
      + ['-' if rate is None else rate_name(rate)]
      + ['-' if row is None else tables.pct_spread(row['accuracy']), seeds]
    )
  w, n, k = CELL
  return (
    f'**The learning-rate sweep at width {w}, ({n}, {k})**, 4,000 steps: seed 0 at each peak '
    'rate, then the best rate (on seed 0) with the mean ± half the range of its seeds ("-": '
    'not run).\n\n'
    + tables.md_table(
      ['mechanism']
      + [f'{rate_name(r)}, seed 0' for r in RATES]
      + ['best rate', 'at the best rate', 'seeds'],
      lines,
      'lrrrrrl',
    )
  )

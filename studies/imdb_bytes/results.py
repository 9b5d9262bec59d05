"""The byte-level IMDB study's results table, from real_imdb_bytes_seeds.json and
performer_seed0.json (`python -m studies.tables`)."""

from studies import tables

JSON = 'studies/imdb_bytes/real_imdb_bytes_seeds.json'
LOST = 'studies/imdb_bytes/performer_seed0.json'  # Performer's seed 0, its workdir lost
QUESTION = "Which of three mechanisms leaves chance first on LRA's byte-level Text task?"
BUDGET = '2,000 steps'
NAMES = dict(linear='linear (elu+1)', softmax='softmax', performer='Performer')
LRA_TRANSFORMER = 0.6427  # the Long Range Arena's Transformer on Text (Tay et al. 2021)


def _runs():
  """{mechanism: {seed: run}} of both files."""
  found = {}
  for r in tables.load(JSON)['runs'] + tables.load(LOST)['runs']:
    found.setdefault(r['mechanism'], {})[r['seed']] = r
  return found


def _means():
  return {
    m: tables.mean_spread([r['eval_accuracy'] for r in v.values()])[0] for m, v in _runs().items()
  }


def table() -> str:
  runs, means = _runs(), _means()
  softmax = runs['softmax'][1]['steady_examples_per_sec']
  rows = []
  for m in sorted(means, key=lambda m: -means[m]):
    seeds = [runs[m][s] for s in sorted(runs[m])]
    rate = runs[m][1]['steady_examples_per_sec']
    rows.append(
      [NAMES[m]]
      + [tables.pct(r['eval_accuracy']) for r in seeds]
      + [
        tables.pct_spread([r['eval_accuracy'] for r in seeds]),
        f'{seeds[-1]["eval_loss"]:.3f}',
        f'{rate:.1f}',
        f'{rate / softmax:.1f}x',
      ]
    )
  note = (
    'Validation accuracy after 2,000 steps of batch 32 on 2,500 held-out reviews (chance: '
    '50%); mean ± half the range. Speed: seed 1, one core each of one machine; softmax '
    'shared its machine for its last 1,000 steps, so its rate is a lower bound. '
    "Performer's seed 0 is from performer_seed0.json. "
    f"LRA's Transformer reaches {tables.pct(LRA_TRANSFORMER)} at 20,000 steps."
  )
  return (
    tables.md_table(
      [
        'mechanism',
        'seed 0',
        'seed 1',
        'mean',
        'final loss, seed 1',
        'examples/s, seed 1',
        'speed vs softmax',
      ],
      rows,
    )
    + '\n\n'
    + note
  )


def headline() -> str:
  means = _means()
  return (
    ', '.join(
      f'{NAMES[m].split()[0]} {tables.pct(means[m])}'
      for m in sorted(means, key=lambda m: -means[m])
    )
    + ' (chance: 50%)'
  )

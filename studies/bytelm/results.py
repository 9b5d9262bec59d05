"""The byte-level LM study's results table, from bytelm.json (`python -m studies.tables`)."""

from studies import tables

JSON = 'studies/bytelm/bytelm.json'
QUESTION = 'How well do six causal mechanisms model IMDB reviews byte by byte, for their state?'
BUDGET = '2,000 steps'
NAMES = dict(
  softmax='softmax',
  linear='linear',
  performer='Performer',
  gla='GLA',
  mamba2='Mamba-2',
  gated_deltanet='Gated DeltaNet',
)


def _runs():
  """{mechanism: [runs by seed]} of the finished runs."""
  found = {}
  for r in sorted(tables.load(JSON)['runs'], key=lambda r: r['seed']):
    if r.get('finished'):
      found.setdefault(r['mechanism'], []).append(r)
  return found


def _bits(runs):
  return tables.mean_spread([r['bits_per_byte'] for r in runs])


def table() -> str:
  d, runs = tables.load(JSON), _runs()
  rows = []
  for m in sorted(runs, key=lambda m: _bits(runs[m])[0]):
    mean, spread = _bits(runs[m])
    mine = runs[m]
    rows.append(
      [
        NAMES.get(m, m),
        f'{mean:.3f} ± {spread:.3f}',
        ' / '.join(f"{r['bits_per_byte']:.3f}" for r in mine),
        tables.pct(sum(r['accuracy'] for r in mine) / len(mine), 1),
        f"{sum(r['examples_per_sec'] for r in mine) / len(mine):.1f}",
        f"{mine[0]['decode_state_bytes']:,}",
        f"{mine[0]['params']:,}",
      ]
    )
  b = d['count_baselines']
  note = (
    f"Validation bits per byte on {b['validation_bytes']:,} held-out bytes, mean ± half "
    f"the range of seeds 0 and 1; examples/s: windows of 256 bytes per second on one "
    f"core. Byte counts fitted to the {b['train_bytes']:,} training bytes: unigram "
    f"{b['unigram']:.3f}, bigram (the byte before) {b['bigram']:.3f} bits/byte."
  )
  return (
    tables.md_table(
      [
        'mechanism',
        'bits/byte',
        'seed 0 / 1',
        'next-byte accuracy',
        'examples/s',
        'decoding state (bytes, 256-byte context)',
        'parameters',
      ],
      rows,
    )
    + '\n\n'
    + note
  )


def headline() -> str:
  runs = _runs()
  order = sorted(runs, key=lambda m: _bits(runs[m])[0])
  states = [runs[m][0]['decode_state_bytes'] for m in order if m != 'softmax']
  return (
    'bits/byte: '
    + ', '.join(f'{NAMES[m]} {_bits(runs[m])[0]:.3f}' for m in order)
    + f"; decoding state {min(states) // 1024}-{max(states) // 1024} KiB against "
    f"softmax's {runs['softmax'][0]['decode_state_bytes'] // 1024} KiB"
  )

"""The recall study's results tables, from its reports' JSON (`python -m studies.tables`).

recall_d.json holds every run of budgets C and D and the width-128 probes (its `rows`:
a group of seeds per mechanism, width, cell and budget); recall.json holds budget A and
recall_budget.json budget B with the width-64 probes; recall_lr.json the learning-rate sweep.
The tables: the grid at budget D (the six core mechanisms and Based's hybrid), the sweep's
best rate per mechanism (`swept`), every other causal mechanism at one cell, and the earlier
budgets with the probes that chose budget D. A row is picked by its exact
label, so runs with other options (ablations) do not enter these tables.
"""

import os
from typing import Dict, List, Optional, Sequence, Tuple

from studies import tables
from studies.recall import swept

SOURCES = (
  'studies/recall/recall.json',
  'studies/recall/recall_budget.json',
  'studies/recall/recall_d.json',
  'studies/recall/ablation.json',
  'studies/recall/recall_lr.json',
)  # a later file's
# row wins; ablation.json: the ablations of Gated DeltaNet and Mamba-2 (their own labels);
# recall_lr.json: the learning-rate sweep's runs at 3e-3 and 1e-2 (`swept`)
# Gated DeltaNet's default initialisation is fla's since 0.2.0 (the ablations below); every
# grid run before used PyTorch's, now `init=default`.
GDN_TORCH = 'gated_deltanet init=default'
# Mamba-2's convolution has a bias by default since 0.2.0 (as mamba_ssm's and fla's); every
# Mamba-2 run of the grid had none.
MAMBA2_GRID = 'mamba2 conv_bias=False'
DECAY_INIT = 'studies/recall/decay_init.json'
# The ablations at width 64, (128, 8): (what changes, label, budget).
ABLATIONS = (
  (
    'as in the grid: A in [0, 16], dt in [0.001, 0.1], PyTorch init, 2 heads, lr 1e-3',
    GDN_TORCH,
    (4000, 1e-3, 1024),
  ),
  (
    'dt in [0.0001, 0.001]: every head starts near no decay',
    'gated_deltanet dt_max=0.001 dt_min=0.0001 init=default',
    (4000, 1e-3, 1024),
  ),
  (
    "fla's initialisation: N(0, 0.02) for convolution and gates",
    'gated_deltanet',
    (4000, 1e-3, 1024),
  ),
  (
    '4 heads of 16 (2 of 32 in the grid)',
    'gated_deltanet init=default heads=4',
    (4000, 1e-3, 1024),
  ),
  ('peak learning rate 3e-3', GDN_TORCH, (4000, 3e-3, 1024)),
  ('DeltaNet: no decay, no output gate (reference)', 'deltanet', (4000, 1e-3, 1024)),
  (
    'Mamba-2 as in the grid: PyTorch init, no conv bias (mean of 3 seeds)',
    MAMBA2_GRID,
    (4000, 1e-3, 1024),
  ),
  (
    "Mamba-2 as mamba_ssm and fla start it: fla's init, a conv bias",
    'mamba2 init=fla',
    (4000, 1e-3, 1024),
  ),
  ('Mamba-2 as in the grid, peak learning rate 3e-3', MAMBA2_GRID, (4000, 3e-3, 1024)),
)
QUESTION = (
  'Which causal mechanisms recall key-value pairs (Zoology\'s MQAR), and how much '
  'state do they keep?'
)
BUDGET = '4,000 steps'
CORE = ('softmax', 'deltanet', GDN_TORCH, 'gated_deltanet', MAMBA2_GRID, 'gla', 'linear')
BASED = 'linear+local feature_map=taylor qk_dim=16 window=64'
NAMES = {
  'softmax': 'softmax',
  'deltanet': 'DeltaNet',
  GDN_TORCH: 'Gated DeltaNet, PyTorch init',
  'gated_deltanet': "Gated DeltaNet, fla's init (the default)",
  MAMBA2_GRID: 'Mamba-2, no conv bias',
  'gla': 'GLA',
  'linear': 'linear',
  BASED: "Based's hybrid",
  'deltanet conv_size=0': 'DeltaNet, no convolution',
}
GRID = ((64, 128, 8), (64, 256, 16), (128, 128, 8), (128, 256, 16))  # width, seq_len, pairs
ONE_CELL = (128, 256, 16)
# Budgets: (steps, peak learning rate, vocabulary).
BUDGETS = {
  'A': (1000, 1e-2, 1024),
  'B': (4000, 3e-3, 8192),
  'C': (2000, 3e-3, 1024),
  'D': (4000, 1e-3, 1024),
}

Key = Tuple[str, int, int, int, Tuple[int, float, int]]


def rows() -> Dict[Key, dict]:
  """{(label, width, seq_len, pairs, budget): row} of every source (that exists)."""
  found = {}
  for path in SOURCES:
    if not os.path.exists(os.path.join(tables.ROOT, path)):
      continue
    for r in tables.load(path)['rows']:
      budget = (r['steps'], r['learning_rate'], r['vocab_size'])
      found[r['mechanism'], r['width'], r['seq_len'], r['num_kv_pairs'], budget] = r
  return found


def _value(row: Optional[dict], seeds: bool = False) -> str:
  if row is None:
    return '-'
  text = tables.pct_spread(row['accuracy'])
  if seeds and len(row['accuracy']) > 1:
    text += ' (' + ', '.join(f'{100 * a:.2f}' for a in row['accuracy']) + ')'
  return text


def _device(names: Sequence[str]) -> str:
  short = [n.split()[1] if n.startswith('NVIDIA ') else 'CPU core' for n in names]
  return (
    short[0] if len(set(short)) == 1 else ', '.join(f'{d} (seed {i})' for i, d in enumerate(short))
  )


def _state(row: Optional[dict]) -> str:
  if row is None:
    return '-'
  return 'no decoding form' if row['state_bytes'] is None else f"{row['state_bytes']:,}"


def grid_table(found: Dict[Key, dict]) -> str:
  d = BUDGETS['D']
  rows_ = []
  for label in CORE + (BASED,):
    cells = [found.get((label, w, n, k, d)) for w, n, k in GRID]
    rows_.append(
      [NAMES[label]]
      + [_value(c, seeds=True) for c in cells]
      + [f'{_state(cells[1])} / {_state(cells[3])}']
    )
  gpu = [
    f'{NAMES[label]} at width {w}, ({n}, {k}) ({_device(found[key]["devices"])})'
    for label in CORE + (BASED,)
    for w, n, k in GRID
    for key in [(label, w, n, k, d)]
    if key in found and any(x.startswith('NVIDIA') for x in found[key].get('devices', []))
  ]
  return (
    '**The grid at budget D**: test accuracy, mean ± half the range (the seeds in '
    'brackets).\n\n'
    + tables.md_table(
      ['mechanism']
      + [f'width {w}, ({n}, {k})' for w, n, k in GRID]
      + ['decode state at (256, 16), bytes: width 64 / 128'],
      rows_,
    )
    + (
      '\n\nOn a GPU: ' + '; '.join(gpu) + '. Every other run of this table: one CPU core.'
      if gpu
      else ''
    )
  )


def one_cell_table(found: Dict[Key, dict]) -> str:
  w, n, k = ONE_CELL
  mine = [
    r
    for (label, *cell), r in found.items()
    if tuple(cell) == (w, n, k, BUDGETS['D']) and label not in CORE + (BASED,) and ' ' not in label
  ]
  mine.sort(key=lambda r: -r['mean'])
  return (
    f'**Every other causal mechanism at width {w}, ({n}, {k})**, budget D, two seeds '
    'each.\n\n'
    + tables.md_table(
      ['mechanism', 'test accuracy', 'seeds', 'decode state, bytes', 'ran on'],
      [
        [
          r['mechanism'],
          tables.pct_spread(r['accuracy']),
          ', '.join(f'{100 * a:.2f}' for a in r['accuracy']),
          _state(r),
          _device(r['devices']),
        ]
        for r in mine
      ],
      'lrrrl',
    )
  )


def earlier_table(found: Dict[Key, dict]) -> str:
  columns = tuple(c for c in CORE if c != 'gated_deltanet') + ('deltanet conv_size=0',)
  named = {b: name for name, b in BUDGETS.items()}
  lines: List[list] = []
  for name in ('A', 'B', 'C'):
    for w, n, k in GRID:
      cells = [found.get((label, w, n, k, BUDGETS[name])) for label in columns]
      if any(cells):
        lines.append(
          [f'{name}: {_budget(BUDGETS[name])}', w, f'({n}, {k})'] + [_value(c) for c in cells]
        )
  probes = sorted(
    ((w, b), r)
    for (label, w, n, k, b), r in found.items()
    if label == 'softmax' and (n, k) == (128, 8) and b not in named
  )
  for (w, b), r in probes:
    lines.append([f'probe: {_budget(b)}', w, '(128, 8)', _value(r)] + ['-'] * (len(columns) - 1))
  return (
    '**Earlier budgets, and the softmax probes that led to budget D**: test accuracy, '
    'mean ± half the range; a value without ± is one seed.\n\n'
    + tables.md_table(
      ['budget: steps, peak learning rate, vocabulary', 'width', 'cell']
      + [NAMES[c] for c in columns],
      lines,
      'lrl' + 'r' * len(columns),
    )
  )


def _budget(b: Tuple[int, float, int]) -> str:
  """(1000, 0.01, 1024) -> '1,000, 1e-2, 1,024'."""
  mantissa, exponent = f'{b[1]:.0e}'.split('e')
  return f'{b[0]:,}, {mantissa}e{int(exponent)}, {b[2]:,}'


def ablation_table(found: Dict[Key, dict]) -> str:
  lines = []
  for what, label, budget in ABLATIONS:
    r = found.get((label, 64, 128, 8, budget))
    seeds = {s: a for s, a in zip(r['seeds'], r['accuracy'])} if r else {}
    lines.append([what] + [tables.pct(seeds.get(s)) for s in (0, 1)] + [_value(r)])
  return (
    '**Ablations at width 64, (128, 8)**: Gated DeltaNet, then Mamba-2; budget D unless '
    'the row changes it: test accuracy per seed, and mean ± half the range ("-": not run '
    'or not finished).\n\n'
    + tables.md_table(['what changes', 'seed 0', 'seed 1', 'mean'], lines, 'lrrr')
  )


def decay_table() -> str:
  """What each Gated DeltaNet head keeps over 128 tokens at initialisation, per seed, at
  widths 64 and 128 side by side."""
  data = tables.load(DECAY_INIT)['rows']

  def kept(width, seed, block):
    return ', '.join(
      f"{r['kept']:.2f}"
      for r in data
      if r['mechanism'] == 'gated_deltanet'
      and r['width'] == width
      and r['seed'] == seed
      and not r['options']
      and r['block'] == block
    )

  lines = [[seed] + [kept(w, seed, b) for w in (64, 128) for b in (0, 1)] for seed in (0, 1)]
  return (
    '**What each Gated DeltaNet head keeps of a token 128 tokens later, at '
    'initialisation** (exp(-128 A dt), heads 0 and 1 of each block; `python -m '
    'studies.recall.decay_init`).\n\n'
    + tables.md_table(
      ['seed', 'width 64: block 0', 'block 1', 'width 128: block 0', 'block 1'], lines
    )
  )


def table() -> str:
  found = rows()
  return '\n\n'.join(
    [
      grid_table(found),
      swept.table(found),
      one_cell_table(found),
      earlier_table(found),
      ablation_table(found),
      decay_table(),
    ]
  )


def headline() -> str:
  found = rows()
  d = BUDGETS['D']
  solved = [
    NAMES[m]
    for m in CORE + (BASED,)
    if all((m, w, n, k, d) in found and found[m, w, n, k, d]['mean'] > 0.99 for w, n, k in GRID)
  ]
  cell = [r for (m, *c), r in found.items() if tuple(c) == ONE_CELL + (d,) and ' ' not in m]
  high = sorted((r for r in cell if r['mean'] > 0.5), key=lambda r: -r['mean'])
  rest = max(r['mean'] for r in cell if r['mean'] <= 0.5)
  return (
    f"test accuracy at budget D: {' and '.join(solved)} over 99% in every grid cell; at "
    'width 128, (256, 16): '
    + ', '.join(f"{r['mechanism']} {tables.pct(r['mean'])}" for r in high)
    + f', every other mechanism {tables.pct(rest)} or less'
  )

"""The recall study's plan: the runs it is made of, and those a set of runs lacks."""

from typing import Any, Dict, List, Sequence

from efficient_attn import registry
from studies.recall import run_records
from studies.recall import sweep

GRID = ((64, 128, 8), (64, 256, 16), (128, 128, 8), (128, 256, 16))  # width, seq_len, pairs
ONE_CELL = (128, 256, 16)  # where every other causal mechanism runs once per seed
# Based's hybrid (Arora et al. 2024) as the grid runs it: its Taylor linear attention
# (feature width 16) in the first block, sliding-window attention (64 tokens) in the second.
BASED = ('linear+local', (('feature_map', 'taylor'), ('qk_dim', 16), ('window', 64)))
SEEDS = (0, 1)


def plan() -> List[Dict[str, Any]]:
  """The study's runs, as `run_records.run_key` reads them: the sweep's mechanisms (softmax, linear
  attention and the gated and delta-rule four) and Based's hybrid (BASED) at every width and
  cell of GRID, and every other mechanism with a causal form at ONE_CELL, each for every
  seed of SEEDS, at the sweep's default budget (vocabulary, learning rate, steps). Ordered
  by width, cell and mechanism, a mechanism's seeds together. A run with sweep settings
  beyond its mechanism (BASED's options) has them in 'settings' ('key=value;...')."""
  d = sweep.DEFAULTS
  core = [(m, ()) for m in d['mechanisms']] + [BASED]
  others = [(m, ()) for m in registry.names_where(lambda m: m.causal) if m not in d['mechanisms']]
  cells = [(m, w, l, p) for w, l, p in GRID for m in core] + [(m,) + ONE_CELL for m in others]
  return [
    dict(
      mechanism=run_records.row_label(m, dict(options)),
      settings=';'.join(f'{k}={v}' for k, v in options),
      width=w,
      seq_len=l,
      num_kv_pairs=p,
      vocab_size=d['vocab_size'],
      learning_rate=d['learning_rate'],
      steps=d['num_steps'],
      seed=s,
    )
    for (m, options), w, l, p in cells
    for s in SEEDS
  ]


def missing(
  runs: List[Dict[str, Any]], mechanisms: Sequence[str] = (), widths: Sequence[int] = ()
) -> List[str]:
  """The runs of `plan()` (of these mechanisms and widths, if named) that `runs` lack, as
  'seed:mechanism:width:cell[:settings]' (studies/recall/gpu/run.sh's form; settings
  'key=value;...', the sweep's, for a run that has them: BASED)."""
  have = {run_records.run_key(r) for r in runs}
  return [
    f'{r["seed"]}:{r["mechanism"].split()[0]}:{r["width"]}:'
    f'{r["seq_len"]}x{r["num_kv_pairs"]}' + (f':{r["settings"]}' if r['settings'] else '')
    for r in run_records.select(plan(), mechanisms, widths)
    if run_records.run_key(r) not in have
  ]

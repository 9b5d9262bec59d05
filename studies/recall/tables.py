"""The recall study's tables: runs grouped over seeds, the report's markdown table and the
decode-state table."""

from typing import Any, Dict, List, Optional

import numpy as np

from benchmarks import runs as runs_io
from efficient_attn import registry
from studies.recall import decode_state
from studies.recall import run_records
from studies.recall import study_plan


def group(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Runs (with their `state_bytes`) grouped by (mechanism, width, seq_len, num_kv_pairs) and
  budget (vocabulary, learning rate, steps): mean and spread over seeds."""
  groups: Dict[tuple, List[Dict[str, Any]]] = {}
  for r in runs:
    groups.setdefault(run_records.run_key(r)[:-1], []).append(r)  # all but the seed
  rows = []
  for (mechanism, width, seq_len, pairs, _, _, _), members in groups.items():
    members.sort(key=lambda r: r['seed'])
    acc = [float(r['accuracy']) for r in members]
    mean, spread = runs_io.mean_spread(acc)
    rows.append(
      dict(
        mechanism=mechanism,
        width=width,
        seq_len=seq_len,
        num_kv_pairs=pairs,
        seeds=[r['seed'] for r in members],
        accuracy=acc,
        mean=mean,
        spread=spread,
        train_accuracy=[float(r['train_accuracy']) for r in members],
        examples_per_sec=float(np.mean([r['examples_per_sec'] for r in members])),
        examples_per_sec_each=[float(r['examples_per_sec']) for r in members],
        devices=[r.get('device') or '' for r in members],
        params=members[0]['params'],
        steps=members[0]['steps'],
        vocab_size=members[0]['vocab_size'],
        learning_rate=members[0]['learning_rate'],
        state_bytes=members[0]['state_bytes'],
        workdirs=[r['workdir'] for r in members],
      )
    )
  rows.sort(key=lambda r: (r['seq_len'], r['num_kv_pairs'], r['width'], -r['mean']))
  return rows


def _state_cell(n: Optional[int]) -> str:
  return 'no decoding form' if n is None else f'{n:,}'


def _device_short_name(name: str) -> str:
  """'NVIDIA H100 80GB HBM3' -> 'H100'; '' (not recorded) and 'cpu' -> 'cpu'."""
  if name.startswith('NVIDIA '):
    return name.split()[1]
  return name or 'cpu'


def throughput(r: Dict[str, Any]) -> str:
  """A row's examples/s: the seeds' mean, its device named unless a CPU ('' = a run from
  before results.json named its device: in this study, one CPU core); each seed's with
  its device when they ran on different devices."""
  devices = [_device_short_name(d) for d in r.get('devices') or [''] * len(r['seeds'])]
  if len(set(devices)) == 1:
    return f"{r['examples_per_sec']:,.0f}" + ('' if devices[0] == 'cpu' else f' ({devices[0]})')
  return ', '.join(f'{e:,.0f} ({d})' for e, d in zip(r['examples_per_sec_each'], devices))


def budget(r: Dict[str, Any]) -> str:
  """A run's or row's budget: '1000 steps, lr 0.01, vocab 1024'."""
  return f"{r['steps']} steps, lr {r['learning_rate']:g}, vocab {r['vocab_size']}"


def count_budgets(rows: List[Dict[str, Any]]) -> int:
  """How many budgets the runs or rows hold."""
  return len({budget(r) for r in rows})


def markdown(rows: List[Dict[str, Any]], command: str) -> str:
  """The table; a 'budget' column when the rows hold more than one budget."""
  several = count_budgets(rows) > 1
  extra = (' budget |', '---|') if several else ('', '')
  lines = [
    f'command: `{command}`',
    '',
    '| cell (seq_len, pairs) | width | mechanism |' + extra[0] + ' test accuracy, mean '
    '± spread | seeds | decode state (bytes / sequence) | params | examples/s (one '
    'CPU core, or the device named) |',
    '|:---|---:|:---|' + extra[1] + '---:|:---|---:|---:|---:|',
  ]
  for r in rows:
    seeds = ', '.join(f'{s}: {100 * a:.2f}%' for s, a in zip(r['seeds'], r['accuracy']))
    lines.append(
      f"| ({r['seq_len']}, {r['num_kv_pairs']}) | {r['width']} | {r['mechanism']} "
      + (f'| {budget(r)} ' if several else '')
      + f"| {100 * r['mean']:.2f} ± {100 * r['spread']:.2f}% | {seeds} "
      f"| {_state_cell(r['state_bytes'])} | {r['params']:,} | {throughput(r)} |"
    )
  return '\n'.join(lines) + '\n'


def state_table() -> str:
  """Markdown: bytes per sequence of every causal mechanism's decode state over
  `study_plan.GRID`."""
  lines = [
    '| mechanism | ' + ' | '.join(f'width {w}, ({n}, {k})' for w, n, k in study_plan.GRID) + ' |',
    '|:---|' + '---:|' * len(study_plan.GRID),
  ]
  for m in registry.names_where(lambda d: d.causal):
    cells = [
      decode_state.state_bytes(
        decode_state.mqar_config(f'{m},d_model={w},seq_len={n},num_kv_pairs={k}')
      )
      for w, n, k in study_plan.GRID
    ]
    lines.append(f'| `{m}` | ' + ' | '.join(_state_cell(c) for c in cells) + ' |')
  return '\n'.join(lines) + '\n'

"""The recall study's runs: read from finished workdirs and earlier reports, merged, and
selected by mechanism, width and budget.

A run is a dict of RUN_FIELDS (and OPTIONAL_FIELDS when known): what a report's .json keeps
of it. `run_key` says when two runs are the same run.
"""

import glob
import json
import os
from typing import Any, Dict, List, Optional, Sequence

from benchmarks import runs as runs_io
from configs import common
from configs import mqar
from efficient_attn.layers import hybrid
from studies.recall import decode_state
from train import api


def label(config) -> str:
  """The mechanism's name, with each attention option set away from its declared default
  ('deltanet conv_size=0') and a head count off configs/mqar.py's ('softmax heads=4');
  block and chunk sizes, which the config fits to the length (`common.fit_blocks`), and
  unset options (None) are not named."""
  mechanism = config.attention.mechanism
  declared = hybrid.option_defaults(mechanism)
  changed = hybrid.off_defaults(
    mechanism,
    {
      k: v
      for k, v in config.attention.options.items()
      if k in declared and k not in common.BLOCK_OPTIONS and v is not None
    },
  )
  extra = ['rotary'] if config.attention.get('rotary') else []
  heads = config.model.num_heads
  extra += [f'heads={heads}'] if heads != mqar.DEFAULTS['num_heads'] else []
  return ' '.join([row_label(mechanism, changed)] + extra)


def row_label(mechanism: str, options: Dict[str, Any]) -> str:
  """'mechanism key=value ...', the options sorted: a row's name (`label`, `plan`)."""
  return ' '.join([mechanism] + [f'{k}={v}' for k, v in sorted(options.items())])


def read_run(workdir: str) -> Dict[str, Any]:
  """One finished run's facts, or {} when it is not finished."""
  results_path = os.path.join(workdir, 'results.json')
  config = api.stored_config(workdir)
  if config is None or not os.path.exists(results_path):
    return {}
  with open(results_path) as f:
    results = json.load(f)
  if results['steps'] < config.train.num_steps:
    return {}
  return dict(
    workdir=workdir,
    mechanism=label(config),
    width=config.model.d_model,
    seq_len=config.dataset.max_length,
    num_kv_pairs=config.dataset.num_kv_pairs,
    vocab_size=config.dataset.vocab_size,
    seed=config.train.seed,
    steps=results['steps'],
    learning_rate=config.optim.learning_rate,
    accuracy=results['eval_accuracy'],
    loss=results['eval_loss'],
    train_accuracy=results['train_accuracy'],
    examples_per_sec=results['steady_examples_per_sec'],
    device=results.get('device', ''),  # '' before results.json named it
    params=results['params_total'],
    curve=train_curve(workdir),
    config=config,
  )


# What a report's .json keeps of each run (`read_run` less its config, plus its state).
RUN_FIELDS = (
  'workdir',
  'mechanism',
  'width',
  'seq_len',
  'num_kv_pairs',
  'vocab_size',
  'seed',
  'steps',
  'learning_rate',
  'accuracy',
  'loss',
  'train_accuracy',
  'examples_per_sec',
  'params',
  'state_bytes',
  'curve',
)
OPTIONAL_FIELDS = ('device',)  # kept when known: reports written before it have none


def run_key(r: Dict[str, Any]) -> tuple:
  """What makes two runs the same run: mechanism, width, cell, budget and seed."""
  return (
    r['mechanism'],
    r['width'],
    r['seq_len'],
    r['num_kv_pairs'],
    r['vocab_size'],
    r['learning_rate'],
    r['steps'],
    r['seed'],
  )


def read_report(path: str) -> List[Dict[str, Any]]:
  """The runs an earlier report was made of: its `runs`, or, from a report that has only
  `rows`, one run per row and seed (the row's throughput, no loss, no curve). A file that is
  not such a report is a one-line exit naming it."""
  data = runs_io.read_report(path)
  runs, rows = (data.get('runs'), data.get('rows')) if isinstance(data, dict) else (None, None)
  if isinstance(runs, list) and all(
    isinstance(r, dict) and set(RUN_FIELDS) <= set(r) for r in runs
  ):
    return [dict(r) for r in runs]
  per_row = (
    'mechanism',
    'width',
    'seq_len',
    'num_kv_pairs',
    'vocab_size',
    'steps',
    'learning_rate',
    'examples_per_sec',
    'params',
    'state_bytes',
  )
  per_seed = ('seeds', 'accuracy', 'train_accuracy', 'workdirs')
  if (
    runs is not None
    or not isinstance(rows, list)
    or not all(isinstance(r, dict) and set(per_row + per_seed) <= set(r) for r in rows)
  ):
    raise SystemExit(
      f'{path}: not a report JSON (it has neither a "runs" list with '
      f'{", ".join(RUN_FIELDS)} nor a "rows" list of seed groups)'
    )
  return [
    dict(
      {k: row[k] for k in per_row},
      workdir=workdir,
      seed=seed,
      accuracy=acc,
      train_accuracy=train,
      loss=None,
      curve=None,
    )
    for row in rows
    for seed, acc, train, workdir in zip(*(row[k] for k in per_seed))
  ]


def merge(stored: List[Dict[str, Any]], read: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """`stored` runs (from reports) with `read` runs (from workdirs) added; a read run replaces
  a stored run with the same `run_key`."""
  runs = {run_key(r): r for r in stored}
  runs.update((run_key(r), r) for r in read)
  return [runs[k] for k in sorted(runs)]


def with_state(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Each run read from a workdir with its `state_bytes`, computed from its config once per
  mechanism, width and cell."""
  cache: Dict[tuple, Optional[int]] = {}

  def state(r):
    key = (r['mechanism'], r['width'], r['seq_len'], r['num_kv_pairs'])
    if key not in cache:
      cache[key] = decode_state.state_bytes(r['config'])
    return cache[key]

  return [dict(r, state_bytes=state(r)) for r in runs]


def train_curve(workdir: str):
  """[steps, train accuracy] logged in the run's metrics.jsonl."""
  points = [
    (m['step'], m['accuracy'])
    for m in runs_io.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
    if m.get('split') == 'train' and 'accuracy' in m
  ]
  return [list(x) for x in zip(*sorted(points))] if points else [[], []]


def read_runs(sources: Sequence[str], state: bool = True) -> List[Dict[str, Any]]:
  """The finished runs of `sources` (earlier reports' .json, and folder globs of workdirs),
  a workdir's replacing a report's of the same `run_key`; `state`: a workdir's run gets its
  decode state (its model built from its config: seconds per mechanism, width and cell)."""
  stored = [r for path in sources if path.endswith('.json') for r in read_report(path)]
  folders = sorted(
    {
      d
      for pattern in sources
      if not pattern.endswith('.json')
      for d in glob.glob(pattern)
      if os.path.isdir(d)
    }
  )
  workdirs = sorted(
    {
      os.path.join(f, d)
      for f in folders
      for d in os.listdir(f)
      if os.path.isdir(os.path.join(f, d))
    }
  )
  read = [r for r in (read_run(w) for w in workdirs) if r]
  read = with_state(read) if state else [dict(r, state_bytes=None) for r in read]
  return merge(stored, [{k: r[k] for k in RUN_FIELDS + OPTIONAL_FIELDS if k in r} for r in read])


def select(
  runs: List[Dict[str, Any]],
  mechanisms: Sequence[str] = (),
  widths: Sequence[int] = (),
  budget: Optional[tuple] = None,
) -> List[Dict[str, Any]]:
  """The runs of these mechanisms (by name, whatever their options), widths and budget
  ((steps, learning_rate, vocab_size)); an empty list or None keeps every one."""
  return [
    r
    for r in runs
    if (not mechanisms or r['mechanism'].split()[0] in mechanisms)
    and (not widths or r['width'] in widths)
    and (budget is None or (r['steps'], r['learning_rate'], r['vocab_size']) == budget)
  ]

"""benchmarks.report's rows: one per workdir (results.json, else the last logged metrics) or
per row of an earlier report, sorted, and grouped over seeds."""

import hashlib
import json
import os
import statistics
from typing import Any, Dict, List, Optional, Tuple

from etils import epath

from benchmarks import runs

# What every report row records of its config: the seed groups' key for rows read from a
# report that predates `config_id`.
DESCRIPTION = (
  'model',
  'dataset',
  'mechanism',
  'projection',
  'heads',
  'd_model',
  'depth',
  'steps',
  'eval_split',
)


def is_workdir(path: str) -> bool:
  """Whether `path` is a folder holding a results.json or a metrics.jsonl."""
  path = epath.Path(path)
  return path.is_dir() and any((path / f).exists() for f in ('results.json', 'metrics.jsonl'))


def expand(pattern: str) -> List[str]:
  """A workdir, or a glob in its last part, which the shell cannot expand for gs://."""
  parent, _, name = pattern.rstrip('/').rpartition('/')
  if not any(c in name for c in '*?['):
    return [pattern]
  return sorted(os.fspath(p) for p in epath.Path(parent or '.').glob(name))


def last_logged(rows: List[Dict[str, Any]], split: str, key: str) -> Optional[float]:
  """The last value of `key` logged on `split` among metrics.jsonl's `rows`; None if none."""
  for row in reversed(rows):
    if row.get('split') == split and row.get(key) is not None:
      return row[key]
  return None


def summarise_run(workdir: str) -> Dict[str, Any]:
  """One table row: results.json when finished, else the last logged metrics."""
  path = epath.Path(workdir)
  results = runs.read_json(path / 'results.json')
  metrics = runs.read_jsonl(path / 'metrics.jsonl')
  config = runs.read_json(path / 'config.json') or {}
  row = dict(run=path.name, workdir=workdir)
  row.update({k: v for k, v in runs.config_info(config).items() if v is not None})
  if (config.get('train') or {}).get('seed') is not None:
    row['seed'] = config['train']['seed']
  row['config_id'] = config_id(config)
  if results:
    row.update(results)
    row['status'] = 'finished'
  else:
    row['status'] = 'running' if metrics else 'empty'
    for split, prefix in (('train', 'train_'), ('eval', 'eval_')):
      for key in ('loss', 'accuracy', 'top5_accuracy'):
        value = last_logged(metrics, split, key)
        if value is not None:
          row[prefix + key] = value
    for key in ('examples_per_sec', 'epoch_time_s'):
      value = last_logged(metrics, 'train', key)
      if value is not None:
        row[key] = value
    value = last_logged(metrics, 'progress', 'steady_examples_per_sec')  # the last printed ex/s
    if value is not None:
      row['steady_examples_per_sec'] = value
    steps = [m['step'] for m in metrics if 'step' in m]
    if steps:
      row['steps'] = max(steps)
  row['curves'] = curves(metrics)
  return row


def config_id(config: Dict[str, Any]) -> str:
  """A short hash of the config without train.seed: runs sharing it differ only in seed."""
  config = dict(config, train={k: v for k, v in (config.get('train') or {}).items() if k != 'seed'})
  return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def from_report(path: str) -> List[Dict[str, Any]]:
  """The rows of an earlier report's JSON, each marked with its `source`."""
  try:
    data = runs.read_json(path)
  except json.JSONDecodeError as e:
    raise SystemExit(f'{path}: not a report JSON (it does not parse: {e})') from None
  if (
    not isinstance(data, dict)
    or not isinstance(data.get('runs'), list)
    or not all(isinstance(r, dict) and 'run' in r for r in data['runs'])
  ):
    raise SystemExit(f'{path}: not a report JSON (it has no "runs" list of named rows)')
  return [dict(r, source=path) for r in data['runs']]


def seed_groups(rows: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], str]:
  """Finished runs grouped by seedless config, for the groups of two runs or more:
  ([{runs, seeds, n, eval_accuracy mean / spread (half the range) / min / max, mean epoch
  time, mean ex/s (`steady_examples_per_sec_mean`) and mean examples/s by epoch
  (`examples_per_sec_mean`)}], what grouped them: 'config' or the DESCRIPTION fields when a
  row from an older report has no config_id)."""
  finished = [
    r for r in rows if r.get('status') == 'finished' and r.get('eval_accuracy') is not None
  ]
  by_config = all(r.get('config_id') for r in finished)
  groups: Dict[Any, List[Dict[str, Any]]] = {}
  for r in finished:
    key = r['config_id'] if by_config else tuple(str(r.get(k)) for k in DESCRIPTION)
    groups.setdefault(key, []).append(r)
  out = []
  for members in groups.values():
    if len(members) < 2:
      continue
    acc = [r['eval_accuracy'] for r in members]
    acc_mean, acc_spread = runs.mean_spread(acc)
    mean = lambda key: (
      statistics.mean(r[key] for r in members)
      if all(r.get(key) is not None for r in members)
      else None
    )
    names = list(dict.fromkeys(r['run'] for r in members))
    out.append(
      dict(
        runs=names,
        mechanism=members[0].get('mechanism'),
        projection=members[0].get('projection'),
        seeds=[r.get('seed') for r in members],
        n=len(members),
        eval_accuracy_mean=acc_mean,
        eval_accuracy_spread=acc_spread,
        eval_accuracy_min=min(acc),
        eval_accuracy_max=max(acc),
        epoch_time_s_mean=mean('epoch_time_s'),
        examples_per_sec_mean=mean('examples_per_sec'),
        steady_examples_per_sec_mean=mean('steady_examples_per_sec'),
      )
    )
  return out, 'config' if by_config else ', '.join(DESCRIPTION)


def curves(metrics: List[Dict[str, Any]]) -> Dict[str, Dict[str, List[float]]]:
  """{split: {'step': [...], 'loss': [...], 'accuracy': [...]}} from metrics.jsonl rows."""
  out: Dict[str, Dict[str, List[float]]] = {}
  for row in metrics:
    if 'step' not in row or 'split' not in row:
      continue
    c = out.setdefault(row['split'], dict(step=[], loss=[], accuracy=[]))
    c['step'].append(row['step'])
    c['loss'].append(row.get('loss'))
    c['accuracy'].append(row.get('accuracy'))
  return out


def sort_rows(rows, key: str):
  """`rows` by --sort's `key` (descending for accuracy and throughput), rows without it
  last; unsorted when `key` is empty."""
  if not key:
    return rows
  descending = 'accuracy' in key or key in ('examples_per_sec', 'steady_examples_per_sec')
  present = [r for r in rows if r.get(key) is not None]
  missing = [r for r in rows if r.get(key) is None]
  return sorted(present, key=lambda r: r[key], reverse=descending) + missing

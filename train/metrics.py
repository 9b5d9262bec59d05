"""Where metrics go: `metrics.jsonl`, TensorBoard events and progress lines.

    writer = metrics.MetricWriter(workdir, enabled=jax.process_index() == 0)
    writer.write(300, 'train', {'loss': 0.41, 'accuracy': 0.87, ...})
    print(metrics.progress_line(300, 1000, {...}, examples_per_sec=2345, eta_s=31))
    # step 300/1000 | loss 0.412 | acc 0.871 | 2345 ex/s | eta 0:00:31

Each metrics.jsonl line is one JSON object with 'step', 'split' ('train' or
'eval') and the metric values; TensorBoard tags are '<split>/<metric>'.
"""
import datetime
import json
import os
from typing import Dict, Mapping, Optional

import numpy as np
import tensorboardX


_SHORT = {'accuracy': 'acc', 'top5_accuracy': 'top5', 'learning_rate': 'lr'}


def reduce_sums(sums: Mapping[str, float]) -> Dict[str, float]:
  """Metric sums with a 'count' (the task convention) -> means."""
  count = max(float(sums['count']), 1.0)
  return {k: float(v) / count for k, v in sums.items() if k != 'count'}


def add_sums(total: Optional[Dict[str, float]], sums: Mapping[str, float]) -> Dict[str, float]:
  total = dict(total or {})
  for k, v in sums.items():
    total[k] = total.get(k, 0.0) + float(np.asarray(v, np.float64))
  return total


def sum_rows(rows) -> Dict[str, float]:
  """Adds up an iterable of metric-sum dicts."""
  total = {}
  for row in rows:
    total = add_sums(total, row)
  return total


def format_duration(seconds: float) -> str:
  return str(datetime.timedelta(seconds=int(max(seconds, 0))))


def progress_line(step: int, total: int, values: Mapping[str, float], *,
                  examples_per_sec: Optional[float] = None,
                  eta_s: Optional[float] = None, prefix: str = 'step') -> str:
  parts = [f'{prefix} {step}/{total}']
  for key in ('loss', 'accuracy', 'top5_accuracy'):
    if key in values:
      parts.append(f'{_SHORT.get(key, key)} {values[key]:.4g}')
  for key, value in values.items():
    if key not in ('loss', 'accuracy', 'top5_accuracy', 'examples_per_sec',
                   'epoch_time_s', 'learning_rate'):
      parts.append(f'{_SHORT.get(key, key)} {value:.4g}')
  if 'learning_rate' in values:
    parts.append(f'lr {values["learning_rate"]:.3g}')
  if examples_per_sec:
    parts.append(f'{examples_per_sec:.0f} ex/s')
  if eta_s is not None:
    parts.append(f'eta {format_duration(eta_s)}')
  return ' | '.join(parts)


class MetricWriter:
  """Writes metrics of process 0; on other processes every call does nothing."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self._jsonl = None
    self._tb = None
    if enabled:
      os.makedirs(workdir, exist_ok=True)
      self._jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a')
      self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, 'tensorboard'))

  def write(self, step: int, split: str, values: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    row = {'step': int(step), 'split': split}
    row.update({k: float(v) for k, v in values.items()})
    self._jsonl.write(json.dumps(row) + '\n')
    self._jsonl.flush()
    for k, v in values.items():
      self._tb.add_scalar(f'{split}/{k}', float(v), int(step))
    self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()

"""Where metrics go: log lines, TensorBoard events and `metrics.jsonl`.

    writer = metrics.create_writer(workdir, enabled=jax.process_index() == 0, resume_step=0)
    writer.write_scalars(300, {'train/loss': 0.41, 'train/accuracy': 0.87})

Each metrics.jsonl line is one JSON object with 'step', 'split' ('train',
'eval', or 'progress' for steps_per_sec and uptime: the part of the key
before '/') and the metric values; a value that
is not finite (NaN, inf) is written as null, so every line is valid JSON.
TensorBoard events are written by `train.tensorboard` (no TensorFlow import), through
epath (a local folder or gs://). A resumed run first drops the lines written after the
step it resumes from, so no row repeats.

What a run prints on stdout (process 0), one line per log interval and one at
the end:

    step 300/660 | loss 0.1564 | accuracy 95.47% | top5_accuracy 99.92% | 1162 ex/s | eta 20s
    step 300/2000 | loss 1.402 | accuracy 58.21% | bits_per_byte 2.023 | 41 ex/s | 10391 tok/s
    test accuracy 96.11% | loss 0.1802 | top5_accuracy 99.72% | results in runs/default/results.json
"""

import errno
import json
import math
import os
from typing import Any, Dict, Mapping, Optional

from absl import logging
from etils import epath
import numpy as np

from train import tensorboard
from train import workdir as workdir_lib

JSONL = 'metrics.jsonl'


TOKENS = 'tokens'  # a task's sum of the real tokens read: the unit of a rate, not a mean


def reduce_sums(sums: Mapping[str, Any]) -> Dict[str, float]:
  """Metric sums with a 'count' (the task convention) -> means ('tokens', the real tokens
  read, is a rate's unit: left out, see `tokens_per_step`)."""
  count = max(float(sums['count']), 1.0)
  return {k: float(v) / count for k, v in sums.items() if k not in ('count', TOKENS)}


def tokens_per_step(rows) -> Optional[float]:
  """The mean real tokens of a step over metric-sum rows (one per step), for a task that
  sums them ('tokens'); None otherwise."""
  rows = list(rows)
  if not rows or TOKENS not in rows[0]:
    return None
  return sum_rows(rows)[TOKENS] / len(rows)


def sum_rows(rows) -> Dict[str, float]:
  """Adds up an iterable of metric-sum dicts (in float64)."""
  total: Dict[str, float] = {}
  for row in rows:
    for k, v in row.items():
      total[k] = total.get(k, 0.0) + float(np.asarray(v, np.float64))
  return total


# Train metrics left out of the progress line (they stay in metrics.jsonl and TensorBoard).
_NOT_PRINTED = ('grad_norm', 'learning_rate')


def duration(seconds: float) -> str:
  """'7s', '2m05s', '1h02m05s': seconds, rounded to the nearest one."""
  s = int(round(seconds))
  if s < 60:
    return f'{s}s'
  if s < 3600:
    return f'{s // 60}m{s % 60:02d}s'
  return f'{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s'


def format_values(values: Mapping[str, float]) -> str:
  """'loss 0.1564 | accuracy 95.47%': the loss first, accuracies as percentages, the rest
  to 4 significant digits."""
  parts = []
  for key, value in sorted(values.items(), key=lambda kv: kv[0] != 'loss'):
    if key in _NOT_PRINTED:
      continue
    value = float(value)
    shown = (
      f'{100 * value:.2f}%'
      if key.endswith('accuracy') and math.isfinite(value)
      else f'{value:#.4g}'
    )
    parts.append(f'{key} {shown}')
  return ' | '.join(parts)


def progress_line(
  step: int,
  num_steps: int,
  values: Mapping[str, float],
  steps_per_sec: Optional[float],
  batch_size: int,
  tokens: Optional[float] = None,
) -> str:
  """'step 300/660 | loss 0.1564 | accuracy 95.47% | 1162 ex/s | eta 20s'.

  `steps_per_sec`: the measured training rate (None before it is known, shown as
  '-'); the ETA is the remaining steps at that rate (evaluations not counted).
  'ex/s' is that rate times the batch size: the trainer's steady rate (`timing.Clock`),
  over every step after the first (which compiles), evaluation, checkpoint saving and
  metric writing excluded. Its value on the last line is results.json's
  `steady_examples_per_sec`, and `benchmarks.report`'s 'ex/s' column. `tokens`: the
  real tokens of a step (`tokens_per_step`), for a task that counts them: 'tok/s' after
  'ex/s' (a packed row holds more of them than a padded one).
  """
  rates = ['ex/s'] + (['tok/s'] if tokens is not None else [])
  if steps_per_sec:
    per_step = {'ex/s': batch_size, 'tok/s': tokens}
    rate = ' | '.join(f'{steps_per_sec * per_step[unit]:.0f} {unit}' for unit in rates)
    eta = duration((num_steps - step) / steps_per_sec)
  else:
    rate, eta = ' | '.join(f'- {unit}' for unit in rates), '-'
  return f'step {step}/{num_steps} | {format_values(values)} | {rate} | eta {eta}'


def final_line(split: str, values: Mapping[str, float], results_path) -> str:
  """'test accuracy 96.11% | loss 0.1802 | ... | results in runs/default/results.json'
  (the accuracy first, when the task has one)."""
  shown = format_values(values)
  if 'accuracy' in values:
    rest = format_values({k: v for k, v in values.items() if k != 'accuracy'})
    shown = format_values({'accuracy': values['accuracy']}) + (f' | {rest}' if rest else '')
  return f'{split} {shown} | results in {results_path}'


def outputs_line(paths: Mapping[str, Any]) -> str:
  """'outputs in runs/bytelm/samples.json, runs/bytelm/samples.txt': the files a task wrote
  (`Task.write_outputs`), said on the line after `final_line`."""
  return 'outputs in ' + ', '.join(str(p) for p in paths.values())


def _finite_or_none(value) -> Optional[float]:
  value = float(value)
  return value if math.isfinite(value) else None


def read_jsonl(path) -> list:
  """The rows of a metrics.jsonl file; a torn last line (a run still writing) is skipped."""
  path = epath.Path(path)
  if not path.exists():
    return []
  rows = []
  for line in path.read_text().splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return rows


class JsonlWriter:
  """`metrics.jsonl`: a line per split and step (write_scalars, flush, close)."""

  def __init__(self, path, resume_step: int = 0):
    self.path = epath.Path(path)
    rows = [r for r in read_jsonl(self.path) if r.get('step', 0) <= resume_step]
    self.path.parent.mkdir(parents=True, exist_ok=True)
    # Replaced whole: a full disk leaves the rows as they were, never a truncated file.
    workdir_lib.write_atomic(self.path, ''.join(json.dumps(r) + '\n' for r in rows))
    self._file = self.path.open('a')

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    rows: Dict[str, Dict[str, Any]] = {}
    for key, value in scalars.items():
      split, _, name = key.rpartition('/')
      rows.setdefault(split or 'progress', {})[name] = _finite_or_none(value)
    try:
      for split, values in rows.items():
        self._file.write(json.dumps({'step': int(step), 'split': split, **values}) + '\n')
      self._file.flush()
    except OSError as e:  # a full disk: the error names the file
      if e.filename is None:
        e.filename = os.fspath(self.path)
      raise

  def flush(self):
    self._file.flush()

  def close(self):
    self._file.close()


class LogWriter:
  """absl INFO lines, one per write: '[300] train/accuracy=0.87, train/loss=0.41' (clu's
  LoggingWriter's format: keys sorted, floats to 6 significant digits)."""

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    values = [
      f'{k}={v:.6g}' if isinstance(v, float) else f'{k}={v}' for k, v in sorted(scalars.items())
    ]
    logging.info('[%d] %s', step, ', '.join(values))

  def flush(self):
    pass

  def close(self):
    pass


class MultiWriter:
  """Writes to each of `writers` in turn (write_scalars, flush, close)."""

  def __init__(self, writers):
    self.writers = list(writers)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    for writer in self.writers:
      writer.write_scalars(step, scalars)

  def flush(self):
    for writer in self.writers:
      writer.flush()

  def close(self):
    for writer in self.writers:
      writer.close()


def create_writer(workdir, *, enabled: bool, resume_step: int = 0) -> MultiWriter:
  """Log lines, TensorBoard events in `workdir/tensorboard` and `workdir/metrics.jsonl`.

  On processes other than the writer (`enabled=False`) only log lines. A full disk
  while making the TensorBoard file is an OSError naming its folder.
  """
  if not enabled:
    return MultiWriter([LogWriter()])
  workdir = epath.Path(workdir)
  try:
    events = tensorboard.EventWriter(workdir / 'tensorboard')
  except OSError as e:
    if not workdir_lib.is_disk_full(e):
      raise
    raise OSError(
      errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(workdir / 'tensorboard')
    ) from None
  return MultiWriter([LogWriter(), JsonlWriter(workdir / JSONL, resume_step), events])

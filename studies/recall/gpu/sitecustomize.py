"""Lets clu import where TensorFlow is not installed (a JAX-only GPU image).

`clu.metric_writers` imports its TensorFlow summary writer unconditionally, so
the trainer's writers and progress reports (clu) need TensorFlow although a run
on generated data needs nothing else of it. Where `tensorflow` is missing, this
file puts clu's own PyTorch TensorBoard writer in that writer's place
(`TorchTensorboardWriter`: the same events, through torch.utils.tensorboard), or,
without PyTorch, a writer that drops the events (`metrics.jsonl` and the log
lines hold the same values). Where TensorFlow is installed it does nothing.

Python imports `sitecustomize` at start-up from the first folder on its path
that holds one: `PYTHONPATH=studies/recall/gpu python main.py ...` (run.sh there).
"""

import importlib.util
import sys
import types


class _DroppedWriter:
  """A clu MetricWriter that writes nothing (every write_* and flush/close a no-op)."""

  def __init__(self, logdir, **kwargs):
    del logdir, kwargs
    print(
      'sitecustomize: no TensorFlow and no PyTorch writer: TensorBoard events are not written',
      file=sys.stderr,
    )

  def __getattr__(self, name):
    return lambda *args, **kwargs: None


class SummaryWriter:
  """clu's TorchTensorboardWriter(logdir), or _DroppedWriter where it cannot be made."""

  def __new__(cls, logdir, **kwargs):
    try:
      from clu.metric_writers import torch_tensorboard_writer  # pylint: disable=g-import-not-at-top

      return torch_tensorboard_writer.TorchTensorboardWriter(logdir)
    except Exception as e:  # pylint: disable=broad-except  (no PyTorch, or no TensorBoard)
      print(f'sitecustomize: {type(e).__name__}: {e}', file=sys.stderr)
      return _DroppedWriter(logdir)


if importlib.util.find_spec('tensorflow') is None:
  _module = types.ModuleType('clu.metric_writers.summary_writer')
  _module.SummaryWriter = SummaryWriter
  sys.modules['clu.metric_writers.summary_writer'] = _module

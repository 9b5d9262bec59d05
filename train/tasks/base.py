"""Task registry: what is learned from a batch, independent of the training loop.

A `Task` tells the trainer how to build the model, what to `init` it with, and
how to turn a batch into a loss and metrics. Tasks are registered by name in
`_TASKS` ('module:attribute', imported on first use); `config.task` picks one.

Metric convention: `loss_and_metrics` returns the scalar loss to differentiate
and a dict of *sums* over the batch's real examples (or tokens) plus 'count',
the sum of the weights; the trainer adds them up over steps, batches and
devices and reports `metric / count`. Padding rows have weight 0.
"""
import dataclasses
import importlib
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import flax.linen as nn

from train import adapters
from train import models

Metrics = Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Task:
  """One kind of training objective.

  Attributes:
    name: `config.task` value.
    create_model: `create_model(config) -> nn.Module`.
    init_inputs: `init_inputs(config) -> inputs` for `model.init` (batch of 1).
    loss_and_metrics: `loss_and_metrics(model, params, batch, *, train, rngs)
      -> (loss, metrics)`, with `rngs` the dict of PRNG keys for `apply`
      ('dropout', 'features') or None in evaluation.
    trainable_fn: `trainable_fn(config)` returns None (train everything) or a
      predicate on parameter paths like 'encoder/block_0/attention/query/kernel';
      parameters it rejects are frozen. The default freezes all but the LoRA
      adapters when `config.lora.rank > 0`.
    init_params_fn: `init_params_fn(config, fresh, loaded) -> params` merges the
      `config.init_from` checkpoint's params `loaded` into the fresh ones; None
      for the default (with LoRA: `lora.load_base`, which fails on any
      mismatch; otherwise copy every leaf whose path and shape match).
    write_outputs: optional `write_outputs(config, model, params, workdir) ->
      {name: path}`, called on process 0 after training and in evaluation
      (pixel_lm: sample PNGs).
  """
  name: str
  create_model: Callable[[Any], nn.Module]
  init_inputs: Callable[[Any], Any]
  loss_and_metrics: Callable[..., Tuple[Any, Metrics]]
  trainable_fn: Callable[[Any], Optional[Callable[[str], bool]]] = adapters.trainable_fn
  init_params_fn: Optional[Callable[[Any, Mapping, Mapping], Mapping]] = None
  write_outputs: Optional[Callable[..., Dict[str, str]]] = None


_TASKS = {
    'classification': 'train.classification:TASK',
    'pixel_lm': 'train.pixel_lm:TASK',
}


def list_tasks():
  return tuple(_TASKS)


def get_task(name: str) -> Task:
  if name not in _TASKS:
    raise ValueError(f'config.task={name!r} is not valid; valid choices: '
                     f'{", ".join(_TASKS)}')
  module, attr = _TASKS[name].split(':')
  return getattr(importlib.import_module(module), attr)


def default_init_inputs(config):
  return models.dummy_inputs(config, batch_size=1)

"""Config validation: every check runs before any data is read or model built.

    validate.validate_config(config)      # raises ConfigError
    resolved = validate.resolve(config)   # the config resolved once: what a run is built from
    config = validate.resolved(config)    # its config: a checked copy, options filled in

Each concern owns its fields and checks them (`data.check`, `modeling.check`,
`attention.resolve`, `optim.check`, `loop.check`, `adapters.check`, declared as
`fields.Field` tables); this module runs them in turn, and keeps what they resolve
(the dataset, what the model reads, the attention's mechanisms and options, the
loop's settings) so that nothing below looks them up or checks them again. Each
message names the field, the bad value and the valid choices, e.g.
"config.attention.mechanism='nystrm' is not valid; valid choices: softmax, ...".
Valid mechanism and projection names come from `efficient_attn.registry`.
"""

import dataclasses
from typing import Tuple

import ml_collections

from configs import fields
import data
from efficient_attn import registry
from efficient_attn.layers import hybrid
from train import adapters
from train import attention as attention_lib
from train import loop as loop_lib
from train import modeling
from train import optim
from train import tasks

ConfigError = fields.ConfigError  # a config field holds a value the experiment cannot run with


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A config resolved once (`resolve`): what a run is built from.

  Attributes:
    config: the checked copy a run records in config.json (`resolved`).
    dataset: `data.Dataset`, what the data pipeline is handed.
    inputs: `modeling.ModelInputs`, what the model reads (its example inputs, the
      sequence its attention sees).
    attention: `attention.Attention`, the attention's mechanism(s) configured for this
      model with their options and settings, passed down the model; its `mechanism`
      (a tuple of declarations for a pattern, 'linear+local':
      `efficient_attn.layers.hybrid`) and complete `options` are also read here.
    loop: `loop.Loop`, the training loop's settings.
  """

  config: ml_collections.ConfigDict
  dataset: data.Dataset
  inputs: modeling.ModelInputs
  attention: attention_lib.Attention
  loop: loop_lib.Loop

  @property
  def mechanism(self) -> hybrid.Mechanisms:
    return self.attention.mechanism

  @property
  def options(self) -> registry.Options:
    return self.attention.options


def validate_config(config) -> Tuple[hybrid.Mechanisms, registry.Options]:
  """Raises ConfigError for the first invalid field of `config`.

  Each concern checks its own fields, in turn: the task, the data (`data.check`), the model
  (`modeling.check`), the attention (`attention.resolve`: the registry's own checks), the
  optimiser (`optim.check`), the training loop (`loop.check`), the samples a task writes,
  and the adapters (`adapters.check`). Returns the mechanism, resolved once:
  (declaration, options).
  """
  attention = _check(config)[2]
  return attention.mechanism, attention.options


def _check(config):
  """validate_config's checks; (dataset, model inputs, attention, loop)."""
  for group in ('dataset', 'model', 'attention', 'optim', 'train'):
    if group not in config:
      raise ConfigError(f'config has no {group!r} group; see configs/common.py')
  try:
    task = tasks.get_task(config.task)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  try:
    dataset = data.check(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  inputs = modeling.check(config, dataset)
  kind = dataset.input_kind
  if kind not in task.reads:
    valid = [name for name, other in tasks.TASKS.items() if kind in other.reads]
    raise ConfigError(
      f'config.task={config.task!r} is not valid for the {kind} dataset '
      f'{config.dataset.name!r}; valid choices: {", ".join(valid)}'
    )
  attention = attention_lib.resolve(config, length=inputs.length, context=inputs.context)
  optim.check(config)
  loop = loop_lib.check(config)
  _samples(config, attention)
  _packing(config, attention)
  adapters.check(config)
  return dataset, inputs, attention, loop


def resolve(config, read_data: bool = True, training: bool = True) -> Resolved:
  """`config` checked and resolved once: a copy with what the data and the registry fill
  in, and the pieces a run is built from (`Resolved`).

  `attention.options` becomes the chosen mechanism's complete options (its
  declared defaults plus what the config set), and `dataset.num_classes` the
  count read from the data when it is 0. `read_data=False` skips the data (a stored
  config, for inference); `training=False` skips the check of the batch against the
  training split (an evaluation may read a file smaller than one training batch).
  """
  config = ml_collections.ConfigDict(config.to_dict())
  dataset, inputs, attention, loop = _check(config)
  config.attention.options = ml_collections.ConfigDict(dict(attention.options))
  resolved = Resolved(config, dataset, inputs, attention, loop)
  if read_data:
    read_data_of(resolved, training)
  return resolved


def read_data_of(resolved: Resolved, training: bool = True) -> None:
  """Prepares and checks the data of a config resolved without it (`resolve(config,
  read_data=False)`), filling in what it tells (num_classes); a ConfigError for a split
  that cannot serve the run. A generated dataset is written here: the trainer checks the
  mesh first, so a bad mesh is refused before minutes of generation."""
  try:
    data.check_splits(resolved.dataset, training)  # fills in num_classes
  except ValueError as e:
    raise ConfigError(str(e)) from None


def resolved(config, read_data: bool = True, training: bool = True) -> ml_collections.ConfigDict:
  """A validated copy of `config` with what the data and the registry fill in (see
  `resolve`): what a run records in config.json."""
  return resolve(config, read_data, training).config


def _packing(config, attention: attention_lib.Attention) -> None:
  """Packed rows (`config.dataset.packing`) need every mechanism of the model to keep
  their documents apart (`Mechanism.segments`): one line naming the first that cannot,
  its reason, and those that can."""
  if not config.dataset.get('packing', False):
    return
  for decl in attention.declarations:
    if not decl.segments:
      what = '' if attention.name == decl.name else f' (its mechanism {decl.name!r})'
      valid = registry.names_where(lambda m: m.segments and m.causal)
      raise ConfigError(
        f'config.dataset.packing=True needs a mechanism that keeps packed documents apart; '
        f'config.attention.mechanism={attention.name!r}{what} cannot ({decl.no_segments}); '
        f'valid choices: {", ".join(valid) or "none yet"}; or set config.dataset.packing=False'
      )


SAMPLES = (  # what `config.sample` accepts (the samples a task writes after training)
  *(
    fields.Field(f'sample.{name}', minimum=0, note='(0 = none)', default=0)
    for name in ('num_samples', 'num_completions')
  ),
)


def _no_decoding(attention: attention_lib.Attention) -> str:
  """'' when every mechanism of `attention` decodes; else 'mechanism=... has no decoding
  form'."""
  missing = attention.without_decoding
  if not missing:
    return ''
  what = '' if (attention.name,) == missing else f' (its mechanism {missing[0]!r})'
  return f'config.attention.mechanism={attention.name!r}{what} has no decoding form'


def _samples(config, attention: attention_lib.Attention) -> None:
  """The samples a task writes after training; `attention`'s mechanisms decode them."""
  fields.check(config, SAMPLES)
  sample = {**tasks.pixel_lm.SAMPLE_DEFAULTS, **(config.get('sample') or {})}
  if (
    config.task == 'pixel_lm'
    and (sample['num_samples'] or sample['num_completions'])
    and (_no_decoding(attention))
  ):
    valid = registry.names_where(lambda mechanism: bool(mechanism.decode))
    raise ConfigError(
      f'{_no_decoding(attention)}, which '
      f"the samples written after training need (config.sample.num_samples="
      f"{sample['num_samples']}, num_completions={sample['num_completions']}); "
      f'valid choices: {", ".join(valid)}; or set both to 0'
    )
  if config.task == 'byte_lm':
    _byte_samples(config, attention)


def _byte_samples(config, attention: attention_lib.Attention) -> None:
  """The held-out continuations a byte LM writes after training (`tasks.byte_lm`)."""
  sample = {**tasks.byte_lm.SAMPLE_DEFAULTS, **(config.get('sample') or {})}
  if sample['num_samples'] <= 0:
    return
  if _no_decoding(attention):
    valid = registry.names_where(lambda mechanism: bool(mechanism.decode))
    raise ConfigError(
      f'{_no_decoding(attention)}, which '
      f"the continuations written after training need (config.sample."
      f"num_samples={sample['num_samples']}); valid choices: {', '.join(valid)}; "
      f'or set it to 0'
    )
  for key in ('prompt_bytes', 'new_bytes'):
    if not isinstance(sample[key], int) or sample[key] < 1:
      raise ConfigError(f'config.sample.{key}={sample[key]!r} is not valid; it must be >= 1')
  max_length = config.dataset.max_length
  if sample['prompt_bytes'] + sample['new_bytes'] > max_length:
    raise ConfigError(
      f"config.sample.prompt_bytes={sample['prompt_bytes']} + new_bytes="
      f"{sample['new_bytes']} exceed the model's context, config.dataset.max_length="
      f'{max_length}; valid: a sum <= '
      f'{max_length}'
    )

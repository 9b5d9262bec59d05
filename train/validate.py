"""Config validation: every check runs before any data is read or model built.

    validate.validate_config(config)   # raises ConfigError
    r = validate.resolve(config)       # the config resolved once: what a run is built from
    config = validate.resolved(config) # r.config: a checked copy, options and num_classes filled in

Each concern owns its fields and checks them (`data.check`, `modeling.check`,
`modeling.check_attention`, `optim.check`, `loop.check`, `adapters.check`, declared as
`fields.Field` tables); this module runs them in turn, and keeps what they resolve
(the dataset, the mechanism's declaration and options, the loop's settings) so
that nothing below looks them up again. Each message
names the field, the bad value and the valid choices, e.g.
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
    mechanism: the attention mechanism's declaration, passed down the model (a tuple of
      them for a pattern, 'linear+local': `efficient_attn.layers.hybrid`).
    options: its complete options (declared defaults plus what the config set; for a
      pattern, `hybrid.merged_options`).
    loop: `loop.Loop`, the training loop's settings.
  """

  config: ml_collections.ConfigDict
  dataset: data.Dataset
  mechanism: hybrid.Mechanisms
  options: registry.Options
  loop: loop_lib.Loop


def validate_config(config) -> Tuple[hybrid.Mechanisms, registry.Options]:
  """Raises ConfigError for the first invalid field of `config`.

  Each concern checks its own fields, in turn: the task, the data (`data.check`), the model
  (`modeling.check`), the attention (`modeling.check_attention`: the registry's own
  checks), the optimiser (`optim.check`), the training loop (`loop.check`), the
  samples a task writes, and the adapters (`adapters.check`). Returns the mechanism,
  resolved once: (declaration, options).
  """
  _, decl, options, _ = _check(config)
  return decl, options


def _check(config):
  """validate_config's checks; (dataset, declaration, options, loop)."""
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
  modeling.check(config, dataset)
  inputs = dataset.input_kind
  if inputs not in task.reads:
    valid = [t for t, v in tasks.TASKS.items() if inputs in v.reads]
    raise ConfigError(
      f'config.task={config.task!r} is not valid for the {inputs} dataset '
      f'{config.dataset.name!r}; valid choices: {", ".join(valid)}'
    )
  decl, options = modeling.check_attention(config, dataset)
  optim.check(config)
  loop = loop_lib.check(config)
  _samples(config, decl)
  adapters.check(config)
  return dataset, decl, options, loop


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
  dataset, decl, options, loop = _check(config)
  config.attention.options = ml_collections.ConfigDict(dict(options))
  if read_data:
    try:
      data.check_splits(dataset, training)  # fills in num_classes
    except ValueError as e:
      raise ConfigError(str(e)) from None
  return Resolved(config, dataset, decl, options, loop)


def resolved(config, read_data: bool = True, training: bool = True) -> ml_collections.ConfigDict:
  """A validated copy of `config` with what the data and the registry fill in (see
  `resolve`): what a run records in config.json."""
  return resolve(config, read_data, training).config


SAMPLES = (  # what `config.sample` accepts (the samples a task writes after training)
  *(
    fields.Field(f'sample.{name}', minimum=0, note='(0 = none)', default=0)
    for name in ('num_samples', 'num_completions')
  ),
)


def _no_decoding(decl: hybrid.Mechanisms) -> str:
  """'' when every mechanism of `decl` decodes; else 'mechanism=... has no decoding form'."""
  missing = [d.name for d in hybrid.declarations(decl) if not d.decode]
  if not missing:
    return ''
  what = '' if [hybrid.name(decl)] == missing else f' (its mechanism {missing[0]!r})'
  return f'config.attention.mechanism={hybrid.name(decl)!r}{what} has no decoding form'


def _samples(config, decl: hybrid.Mechanisms) -> None:
  """The samples a task writes after training; `decl`, the configured mechanism (or a
  pattern's), decodes them."""
  fields.check(config, SAMPLES)
  sample = {**tasks.pixel_lm.SAMPLE_DEFAULTS, **(config.get('sample') or {})}
  if (
    config.task == 'pixel_lm'
    and (sample['num_samples'] or sample['num_completions'])
    and (_no_decoding(decl))
  ):
    valid = registry.names_where(lambda m: bool(m.decode))
    raise ConfigError(
      f'{_no_decoding(decl)}, which '
      f"the samples written after training need (config.sample.num_samples="
      f"{sample['num_samples']}, num_completions={sample['num_completions']}); "
      f'valid choices: {", ".join(valid)}; or set both to 0'
    )
  if config.task == 'byte_lm':
    _byte_samples(config, decl)


def _byte_samples(config, decl: hybrid.Mechanisms) -> None:
  """The held-out continuations a byte LM writes after training (`tasks.byte_lm`)."""
  s = {**tasks.byte_lm.SAMPLE_DEFAULTS, **(config.get('sample') or {})}
  if s['num_samples'] <= 0:
    return
  if _no_decoding(decl):
    valid = registry.names_where(lambda m: bool(m.decode))
    raise ConfigError(
      f'{_no_decoding(decl)}, which '
      f"the continuations written after training need (config.sample."
      f"num_samples={s['num_samples']}); valid choices: {', '.join(valid)}; "
      f'or set it to 0'
    )
  for key in ('prompt_bytes', 'new_bytes'):
    if not isinstance(s[key], int) or s[key] < 1:
      raise ConfigError(f'config.sample.{key}={s[key]!r} is not valid; it must be >= 1')
  if s['prompt_bytes'] + s['new_bytes'] > config.dataset.max_length:
    raise ConfigError(
      f"config.sample.prompt_bytes={s['prompt_bytes']} + new_bytes="
      f"{s['new_bytes']} exceed the model's context, config.dataset.max_length="
      f'{config.dataset.max_length}; valid: a sum <= '
      f'{config.dataset.max_length}'
    )

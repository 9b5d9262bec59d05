"""Config validation: every check runs before any data is read or model built.

    validate.validate_config(config)   # raises ConfigError
    config = validate.resolved(config) # a checked copy: options and num_classes filled in

Each concern owns its fields and checks them (`models.check`,
`models.check_attention`, `optim.check`, `adapters.check`, declared as
`train.fields.Field` tables); this module runs them in turn. Each message
names the field, the bad value and the valid choices, e.g.
"config.attention.mechanism='nystrm' is not valid; valid choices: softmax, ...".
Valid mechanism and projection names come from `efficient_attn.registry`.
"""
import os
from typing import Tuple

import ml_collections

from efficient_attn import registry
import data
from train import adapters
from train import fields
from train import models
from train import optim
from train import tasks
from train import workdir
from data import arrays
from data import specs
from data import transforms

DTYPES = tuple(models.DTYPES)
ConfigError = fields.ConfigError  # a config field holds a value the experiment cannot run with


def _choice(field: str, value, choices) -> None:
  if value not in choices:
    raise ConfigError(f'config.{field}={value!r} is not valid; valid choices: '
                      f'{", ".join(map(str, choices))}')


def _positive(config, *fields) -> None:
  for field in fields:
    value = config
    for part in field.split('.'):
      value = value[part]
    if not isinstance(value, (int, float)) or value <= 0:
      raise ConfigError(f'config.{field}={value!r} is not valid; it must be > 0')


def validate_config(config) -> Tuple[registry.Mechanism, registry.Options]:
  """Raises ConfigError for the first invalid field of `config`.

  Each concern checks its own fields, in turn: the task, the data, the model
  (`models.check`), the attention (`models.check_attention`: the registry's own
  checks), the optimiser (`optim.check`), the training loop (`TRAIN`) and the
  adapters (`adapters.check`). Returns the mechanism, resolved once: (declaration,
  options).
  """
  for group in ('dataset', 'model', 'attention', 'optim', 'train'):
    if group not in config:
      raise ConfigError(f'config has no {group!r} group; see configs/common.py')
  try:
    task = tasks.get_task(config.task)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _dataset(config)
  models.check(config)
  inputs = specs.input_kind(config)
  if inputs not in task.reads:
    valid = [t for t, v in tasks.TASKS.items() if inputs in v.reads]
    raise ConfigError(f'config.task={config.task!r} is not valid for the {inputs} dataset '
                      f'{config.dataset.name!r}; valid choices: {", ".join(valid)}')
  decl, options = models.check_attention(config)
  optim.check(config)
  _train(config, decl)
  adapters.check(config)
  return decl, options


def _dataset(config) -> None:
  d = config.dataset
  _choice('dataset.name', d.name, tuple(specs.DATASETS))
  spec = specs.get_spec(d.name)
  try:
    src = specs.source(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _positive(config, 'dataset.batch_size', 'dataset.eval_batch_size')
  if spec.kind == 'image':
    _positive(config, 'dataset.image_size', 'dataset.channels')
    _choice('dataset.augment', d.augment, specs.AUGMENTATIONS)
    if d.augment == 'inception_crop' and specs.in_memory(config):
      raise ConfigError(f"config.dataset.augment='inception_crop' is not valid for the "
                        f'in-memory dataset {d.name!r} from {src!r}; valid choices: none, '
                        f'crop, crop_flip')
    try:
      if not d.get('pixels_as_tokens'):  # pixel tokens are not normalised
        specs.normalization(config, spec)
    except ValueError as e:
      raise ConfigError(str(e)) from None
  elif spec.kind in ('text', 'text_pair', 'tokens', 'sequence'):
    _positive(config, 'dataset.max_length')
  if spec.kind == 'sequence':
    _sequence(config, src)
  if d.num_classes < 0 or (d.num_classes == 0 and spec.num_classes == 0
                           and src not in ('folder', 'arrays') and spec.kind != 'sequence'):
    raise ConfigError(f'config.dataset.num_classes={d.num_classes!r} is not valid; it '
                      f'must be > 0')
  if spec.num_classes and d.num_classes not in (0, spec.num_classes):
    raise ConfigError(f'config.dataset.num_classes={d.num_classes!r} is not valid for '
                      f'{d.name!r}; valid choices: {spec.num_classes}')
  holdout = d.get('holdout', 0.0)
  if not 0.0 <= holdout < 1.0:
    raise ConfigError(f'config.dataset.holdout={holdout!r} is not valid; it must be in '
                      f'[0, 1) (the fraction of the training split held out as validation)')
  if holdout > 0 and not specs.in_memory(config):
    raise ConfigError(f'config.dataset.holdout={holdout} needs an in-memory dataset; '
                      f'{d.name!r} from {src!r} streams (hold out files instead)')
  if src in ('folder', 'arrays', 'generated', 'tsv') and not d.data_dir:
    what = {'folder': 'the image folder root (root/<split>/<label>/<image>)',
            'arrays': "the .npz file (a '{split}' in it names one file per split)",
            'generated': 'the folder the generated splits are written into',
            'tsv': "the folder of LRA's new_aan_pairs.{train,eval,test}.tsv"}[src]
    raise ConfigError(f"config.dataset.data_dir='' is not valid for dataset {d.name!r} from "
                      f'source {src!r}; it must be {what}')
  if src == 'tfds' and d.data_dir and not d.download and not os.path.isdir(
      d.data_dir) and workdir.is_local(d.data_dir):
    raise ConfigError(f'config.dataset.data_dir={d.data_dir!r} does not exist (and '
                      f'config.dataset.download=False)')
  if spec.manual and d.manual_dir and not os.path.isdir(d.manual_dir) and (
      workdir.is_local(d.manual_dir)):
    raise ConfigError(f'config.dataset.manual_dir={d.manual_dir!r} does not exist')
  if d.get('pixels_as_tokens'):
    if spec.kind != 'image':
      raise ConfigError(f'config.dataset.pixels_as_tokens=True is not valid for the '
                        f'{spec.kind} dataset {d.name!r}; it needs an image dataset')
    _choice('dataset.channels', d.channels, (1,))
  if d.get('transform', '') not in ('', 'none'):
    if spec.kind != 'image':
      raise ConfigError(f'config.dataset.transform={d.transform!r} is not valid for the '
                        f'{spec.kind} dataset {d.name!r}; it needs an image dataset')
    if not specs.in_memory(config):
      raise ConfigError(f'config.dataset.transform={d.transform!r} needs an in-memory '
                        f'dataset; {d.name!r} from {src!r} streams')
    try:
      transforms.get_transform(d.transform)
    except ValueError as e:
      raise ConfigError(f'config.dataset.transform={d.transform!r} is not valid: {e}') from None


def _sequence(config, src: str) -> None:
  """A sequence-labelling dataset: its vocabulary (the labels are tokens of it) and, for
  generated MQAR, the generator's settings."""
  d = config.dataset
  vocab = d.get('vocab_size', 0)
  if not isinstance(vocab, int) or vocab <= 0:
    raise ConfigError(f'config.dataset.vocab_size={vocab!r} is not valid for the sequence '
                      f'dataset {d.name!r}; it must be > 0 (token ids 0..vocab_size-1)')
  if d.num_classes not in (0, d.vocab_size):
    raise ConfigError(f'config.dataset.num_classes={d.num_classes} is not valid for the '
                      f'sequence dataset {d.name!r}, whose labels are tokens; valid choices: '
                      f'0, {d.vocab_size} (config.dataset.vocab_size)')
  if d.get('holdout', 0.0) > 0:
    raise ConfigError(f'config.dataset.holdout={d.holdout} is not valid for the sequence '
                      f'dataset {d.name!r} (holdout splits by class); valid: 0, with a '
                      f"'{{split}}' file per split")
  if src == 'generated' and d.name == 'mqar':
    from data import mqar  # pylint: disable=g-import-not-at-top
    try:
      mqar.check_settings(d.vocab_size, d.max_length, d.get('num_kv_pairs', mqar.NUM_KV_PAIRS),
                          d.get('power_a', mqar.POWER_A))
    except ValueError as e:
      raise ConfigError(f'config.dataset: {e}') from None


def resolved(config, read_data: bool = True,
             training: bool = True) -> ml_collections.ConfigDict:
  """A validated copy of `config` with what the data and the registry fill in.

  `attention.options` becomes the chosen mechanism's complete options (its
  declared defaults plus what the config set), and `dataset.num_classes` the
  count read from the data when it is 0. This is what a run records in
  config.json. `read_data=False` skips the data (a stored config, for inference);
  `training=False` skips the check of the batch against the training split (an
  evaluation may read a file smaller than one training batch).
  """
  _, options = validate_config(config)
  config = ml_collections.ConfigDict(config.to_dict())
  config.attention.options = ml_collections.ConfigDict(dict(options))
  if not read_data:
    return config
  d = config.dataset
  try:
    data.prepare(config)
    _check_splits(config)  # fills in num_classes
    train_examples = data.num_examples(config, d.train_split)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if training and d.batch_size > train_examples:
    raise ConfigError(f'config.dataset.batch_size={d.batch_size} exceeds the {train_examples} '
                      f'examples of split {d.train_split!r}; valid: <= {train_examples}')
  return config


def _check_splits(config) -> None:
  """Every split the run reads has examples, and in-memory labels lie in
  0..num_classes-1 (`dataset.num_classes`, filled in here when 0). ValueError
  naming the file or dataset: an empty test split would otherwise fail only at
  the final evaluation, and an out-of-range label give a NaN loss."""
  d = config.dataset
  splits = {d.train_split: 'train_split', d.eval_split: 'eval_split'}
  if not specs.in_memory(config):  # streamed: counted (an empty train split fails below)
    if specs.source(config) == 'folder' and d.num_classes > 0:  # a label per folder
      from data import stream  # pylint: disable=g-import-not-at-top
      found = stream.folder_num_classes(config)
      if found > d.num_classes:
        raise ValueError(f'config.dataset.num_classes={d.num_classes} is not valid for '
                         f'{d.data_dir}, which has {found} label folders; valid: '
                         f'>= {found}, or 0 (one class per folder)')
    if d.num_classes == 0:
      d.num_classes = data.num_classes(config)
    if data.num_examples(config, d.eval_split) == 0:
      raise ValueError(f'config.dataset.eval_split={d.eval_split!r} of dataset {d.name!r} '
                       f'holds no examples; a run needs at least one')
    return
  for split, field in splits.items():
    arrays.check_split(arrays.get_split(config, split), f'config.dataset.{field}={split!r}')
  if specs.input_kind(config) == 'sequence':  # labels: tokens of the vocabulary, or -100
    from data import sequences  # pylint: disable=g-import-not-at-top
    d.num_classes = d.vocab_size
    for split in splits:
      sequences.check(arrays.get_split(config, split), d.vocab_size, d.max_length)
    return
  classes = 'config.dataset.num_classes'
  if d.num_classes == 0:
    d.num_classes = data.num_classes(config)
    classes = 'num_classes read from the training labels'
  for split in splits:
    arrays.check_labels(arrays.get_split(config, split), d.num_classes,
                        f'{classes}={d.num_classes}')


TRAIN = (  # what `config.train` and `config.sample` accept (the rules between fields: _train)
    *(fields.Field(f'train.{name}', above=0)
      for name in ('log_every', 'checkpoint_every', 'keep_checkpoints')),
    fields.Field('train.dtype', choices=DTYPES),
    *(fields.Field(f'sample.{name}', minimum=0, note='(0 = none)', default=0)
      for name in ('num_samples', 'num_completions')),
)


def _train(config, decl: registry.Mechanism) -> None:
  """The training loop's fields; `decl`, the configured mechanism, for the samples."""
  t = config.train
  if t.num_steps <= 0 and t.num_epochs <= 0:  # num_steps > 0 wins over num_epochs
    raise ConfigError(f'config.train.num_steps={t.num_steps} and config.train.num_epochs='
                      f'{t.num_epochs}: set one of them > 0 (num_steps takes precedence)')
  if t.eval_every == 0 or t.eval_every < -1:
    raise ConfigError(f'config.train.eval_every={t.eval_every} is not valid; it must be '
                      f'> 0, or -1 for only at the end')
  fields.check(config, TRAIN)
  sample = {**tasks.pixel_lm.SAMPLE_DEFAULTS, **(config.get('sample') or {})}
  if config.task == 'pixel_lm' and (sample['num_samples'] or sample['num_completions']) and (
      not decl.decode):
    valid = registry.names_where(lambda m: bool(m.decode))
    raise ConfigError(f'config.attention.mechanism={decl.name!r} has no decoding form, which '
                      f"the samples written after training need (config.sample.num_samples="
                      f"{sample['num_samples']}, num_completions={sample['num_completions']}); "
                      f'valid choices: {", ".join(valid)}; or set both to 0')

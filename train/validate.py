"""Config validation: every check runs before any data is read or model built.

    validate.validate_config(config)   # raises ConfigError
    config = validate.resolved(config) # a checked copy: options and num_classes filled in

Each message names the field, the bad value and the valid choices, e.g.
"config.attention.mechanism='nystrm' is not valid; valid choices: softmax, ...".
Valid mechanism and projection names come from `efficient_attn.registry`.
"""
import os
import re

from etils import epath
import ml_collections

from efficient_attn import layer
from efficient_attn import registry
from efficient_attn.models import text as ea_text
import data
from train import adapters
from train import models
from train import optim
from train import tasks
from train import workdir
from data import arrays
from data import specs
from data import transforms

DTYPES = tuple(models.DTYPES)
REVERSIBLE_KINDS = ('vit', 'text')  # encoders; the causal model decodes


class ConfigError(ValueError):
  """A config field holds a value the experiment cannot run with."""


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


def validate_config(config) -> None:
  """Raises ConfigError for the first invalid field of `config`."""
  for group in ('dataset', 'model', 'attention', 'optim', 'train'):
    if group not in config:
      raise ConfigError(f'config has no {group!r} group; see configs/common.py')
  try:
    task = tasks.get_task(config.task)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _dataset(config)
  _model(config)
  inputs = specs.input_kind(config)
  if inputs not in task.reads:
    valid = [t for t, v in tasks.TASKS.items() if inputs in v.reads]
    raise ConfigError(f'config.task={config.task!r} is not valid for the {inputs} dataset '
                      f'{config.dataset.name!r}; valid choices: {", ".join(valid)}')
  _attention(config)
  _optim(config)
  _train(config)
  if config.get('init_from') and not epath.Path(config.init_from).is_dir():
    raise ConfigError(f'config.init_from={config.init_from!r} is not a directory; it must '
                      f'be the workdir of an earlier run (or empty)')
  if config.get('lora') is not None and config.lora.get('rank', 0) < 0:
    raise ConfigError(f'config.lora.rank={config.lora.rank!r} is not valid; it must be '
                      f'>= 0 (0 = off)')
  if config.get('lora') is not None and config.lora.get('rank', 0) > 0:
    _lora(config)


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


def _model(config) -> None:
  m, d = config.model, config.dataset
  _choice('model.kind', m.kind, models.KINDS)
  inputs = specs.input_kind(config)
  if inputs not in models.READS[m.kind]:
    valid = [k for k in models.KINDS if inputs in models.READS[k]]
    what = 'pixel-token (dataset.pixels_as_tokens)' if inputs == 'pixels' else inputs
    raise ConfigError(f'config.model.kind={m.kind!r} is not valid for the {what} '
                      f'dataset {d.name!r}; valid choices: {", ".join(valid)}')
  if config.task not in models.TASKS[m.kind]:
    valid = [k for k in models.KINDS if config.task in models.TASKS[k]]
    raise ConfigError(f'config.model.kind={m.kind!r} is not valid for config.task='
                      f'{config.task!r}; valid choices: {", ".join(valid)}')
  _positive(config, 'model.d_model', 'model.depth', 'model.num_heads', 'model.mlp_dim')
  if m.d_model % m.num_heads:
    divisors = [h for h in range(1, min(m.d_model, 64) + 1) if m.d_model % h == 0]
    raise ConfigError(f'config.model.num_heads={m.num_heads} does not divide '
                      f'config.model.d_model={m.d_model}; valid choices: '
                      f'{", ".join(map(str, divisors))}')
  _choice('model.pool', m.pool, ea_text.POOLS)
  if m.get('interaction') is not None:
    _choice('model.interaction', m.interaction, ea_text.INTERACTIONS)
  positions = m.get('positions', 'learned')
  _choice('model.positions', positions, ea_text.POSITIONS)
  if positions != 'learned' and m.kind != 'text':
    raise ConfigError(f'config.model.positions={positions!r} is not valid for config.model.'
                      f"kind={m.kind!r}, which only has learned positions; valid choices: "
                      f'learned')
  if m.kind == 'vit':
    _positive(config, 'model.patch_size')
    if d.image_size % m.patch_size:
      divisors = [p for p in range(1, d.image_size + 1) if d.image_size % p == 0]
      raise ConfigError(f'config.model.patch_size={m.patch_size} does not divide '
                        f'config.dataset.image_size={d.image_size}; valid choices: '
                        f'{", ".join(map(str, divisors))}')
  if m.get('reversible', False) and m.kind not in REVERSIBLE_KINDS:
    raise ConfigError(f'config.model.reversible=True is not valid for config.model.kind='
                      f'{m.kind!r} (it samples by decoding, which needs the ordinary '
                      f'stack); valid kinds: {", ".join(REVERSIBLE_KINDS)}')
  for field in ('dropout_rate', 'attention_dropout_rate'):
    if not 0.0 <= m[field] < 1.0:
      raise ConfigError(f'config.model.{field}={m[field]!r} is not valid; it must be in '
                        f'[0, 1)')


def _attention(config) -> None:
  a = config.attention
  _choice('attention.mechanism', a.mechanism, registry.list_mechanisms())
  _choice('attention.projection', a.projection, registry.list_projections())
  if config.model.kind == 'mlp':
    return
  num_kv_heads = a.get('num_kv_heads', 0)
  if num_kv_heads:  # 0: one key/value head per head
    try:
      layer.kv_heads(registry.get_mechanism(a.mechanism), a.projection, config.model.num_heads,
                     num_kv_heads)
    except ValueError as e:
      raise ConfigError(f'config.attention.num_kv_heads={num_kv_heads}: {e}') from None
  length, context = models.sequence_length(config)
  fixed = registry.get_mechanism(a.mechanism).fixed_length
  if (fixed or a.projection == 'super') and length > context:
    what = f'mechanism {a.mechanism!r}' if fixed else "projection 'super'"
    raise ConfigError(f'sequence length {length} (config.dataset.max_length='
                      f'{config.dataset.max_length}) exceeds the fixed context length '
                      f'{context} that {what} is built for (config.model.max_length='
                      f'{config.model.max_length}); valid: lengths <= {context}')
  causal = config.model.kind == 'causal'
  if registry.get_mechanism(a.mechanism).causal_only and config.model.get('pool') == 'cls' and (
      not causal):  # the causal model does not pool
    raise ConfigError(f'config.model.pool=\'cls\' with mechanism {a.mechanism!r}: a causal-only '
                      f'mechanism lets the class token (the first) see only itself; valid: '
                      f'pool=\'mean\'')
  try:
    registry.configure(a.mechanism, models.attention_options(config),
                       causal=causal or registry.get_mechanism(a.mechanism).causal_only,
                       max_length=context, length=length, rotary=a.get('rotary', False))
  except ValueError as e:
    if causal and not registry.get_mechanism(a.mechanism).causal:
      valid = registry.names_where(lambda m: m.causal)
      raise ConfigError(f'config.attention.mechanism={a.mechanism!r} is not valid for the '
                        f'causal model kind {config.model.kind!r} (it has no causal form); '
                        f'valid choices: {", ".join(valid)}') from None
    raise ConfigError(f'config.attention: {e}') from None


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
  validate_config(config)
  config = ml_collections.ConfigDict(config.to_dict())
  a = config.attention
  options = registry.get_mechanism(a.mechanism).resolve(models.attention_options(config))
  a.options = ml_collections.ConfigDict(dict(options))
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


def _lora(config) -> None:
  for target in adapters.targets(config.lora.get('targets', 'default')):
    try:
      re.compile(target)
    except re.error as e:
      raise ConfigError(f'config.lora.targets={config.lora.targets!r}: {target!r} is '
                        f'neither a preset ({", ".join(adapters.PRESETS)}) nor a valid '
                        f'regular expression ({e})') from None
  if config.lora.get('alpha', 0.0) < 0:
    raise ConfigError(f'config.lora.alpha={config.lora.alpha!r} is not valid; it must be '
                      f'>= 0 (0: scale 1)')


def _optim(config) -> None:
  o = config.optim
  _choice('optim.name', o.name, optim.OPTIMIZERS)
  _positive(config, 'optim.learning_rate')
  for field in ('warmup_steps', 'weight_decay', 'grad_clip'):
    if o[field] < 0:
      raise ConfigError(f'config.optim.{field}={o[field]!r} is not valid; it must be >= 0')
  for field in ('b1', 'b2'):
    if not 0.0 <= o[field] < 1.0:
      raise ConfigError(f'config.optim.{field}={o[field]!r} is not valid; it must be in '
                        f'[0, 1)')


def _train(config) -> None:
  t = config.train
  if t.num_steps <= 0 and t.num_epochs <= 0:  # num_steps > 0 wins over num_epochs
    raise ConfigError(f'config.train.num_steps={t.num_steps} and config.train.num_epochs='
                      f'{t.num_epochs}: set one of them > 0 (num_steps takes precedence)')
  _positive(config, 'train.log_every', 'train.checkpoint_every', 'train.keep_checkpoints')
  if t.eval_every == 0 or t.eval_every < -1:
    raise ConfigError(f'config.train.eval_every={t.eval_every} is not valid; it must be '
                      f'> 0, or -1 for only at the end')
  _choice('train.dtype', t.dtype, DTYPES)
  for field in ('num_samples', 'num_completions'):
    value = (config.get('sample') or {}).get(field, 0)
    if value < 0:
      raise ConfigError(f'config.sample.{field}={value!r} is not valid; it must be >= 0 '
                        f'(0 = none)')
  sample = {**tasks.pixel_lm.SAMPLE_DEFAULTS, **(config.get('sample') or {})}
  mechanism = config.attention.mechanism
  if config.task == 'pixel_lm' and (sample['num_samples'] or sample['num_completions']) and (
      not registry.get_mechanism(mechanism).decode):
    valid = registry.names_where(lambda m: bool(m.decode))
    raise ConfigError(f'config.attention.mechanism={mechanism!r} has no decoding form, which '
                      f"the samples written after training need (config.sample.num_samples="
                      f"{sample['num_samples']}, num_completions={sample['num_completions']}); "
                      f'valid choices: {", ".join(valid)}; or set both to 0')

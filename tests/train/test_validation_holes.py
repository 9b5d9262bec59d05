"""Values that slipped past validation (issue 59, item 7): each refused in one line naming
the field, the value and what is valid, before any workdir is written.

A bounded field let NaN and infinities through (`--config.optim.learning_rate=nan`
trained until the first non-finite loss), and `train.seed=-1` failed after config.json
was written (the workdir then refused the corrected seed); the generator's seed, its
split sizes and tf.data's shuffle buffer failed late, or in words naming no field.
"""

import math

import jax
import pytest

from configs import default as default_config
from configs import fields
from configs import imagenet as imagenet_config
from configs import mqar as mqar_config
from train import trainer
from train import validate

SEED_RANGE = f'it must be an integer in [0, {2**63})'


def with_value(config, path, value):
  *parents, name = path.split('.')
  node = config
  for part in parents:
    node = node[part]
  node[name] = value
  return config


@pytest.mark.parametrize(
  'path, value, valid',
  [
    ('optim.learning_rate', math.nan, 'it must be a finite number > 0'),
    ('optim.learning_rate', math.inf, 'it must be a finite number > 0'),
    ('optim.weight_decay', math.inf, 'it must be a finite number >= 0'),
    ('optim.grad_clip', math.nan, 'it must be a finite number >= 0'),
    ('optim.max_warmup_fraction', math.nan, 'it must be a finite number >= 0 (1 = no cap)'),
    ('model.dropout_rate', math.nan, 'it must be a finite number in [0, 1)'),
    ('train.seed', -1, SEED_RANGE),
    ('train.seed', 2**63, SEED_RANGE),  # jax.random.key's limit
  ],
)
def test_a_bad_number_is_refused_in_one_line(path, value, valid):
  config = with_value(default_config.get_config(), path, value)
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(config)
  assert str(e.value) == f'config.{path}={value!r} is not valid; {valid}'


@pytest.mark.parametrize('path, value', [('train.seed', -1), ('optim.learning_rate', math.nan)])
def test_nothing_is_written_for_a_bad_value(path, value, tmp_path):
  """The seed failed after config.json was written; a NaN learning rate trained."""
  config = with_value(default_config.get_config(), path, value)
  workdir = tmp_path / 'run'
  with pytest.raises(validate.ConfigError, match=rf'^config\.{path}='):
    trainer.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


@pytest.mark.parametrize(
  'path, value, valid',
  [
    ('dataset.generator_seed', -1, 'it must be an integer >= 0'),
    ('dataset.sizes.train', -3, 'it must be an integer >= 0'),
  ],
)
def test_the_generators_settings_are_refused_naming_the_field(path, value, valid, tmp_path):
  """generator_seed=-1 failed in numpy ('expected non-negative integer'), and a negative
  size named `sizes['train']`, not the field."""
  config = mqar_config.get_config('linear,d_model=16,seq_len=32,num_kv_pairs=2,vocab_size=64')
  config.dataset.data_dir = str(tmp_path)
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(with_value(config, path, value))
  assert str(e.value) == f'config.{path}={value!r} is not valid; {valid}'


def test_mqars_power_a_is_finite(tmp_path):
  config = mqar_config.get_config('linear,d_model=16,seq_len=32,num_kv_pairs=2,vocab_size=64')
  config.dataset.update(dict(data_dir=str(tmp_path), power_a=math.inf))
  with pytest.raises(
    validate.ConfigError,
    match=r'^config.dataset: MQAR power_a=inf is not '
    r'valid; it must be a finite number > 0',
  ):
    validate.validate_config(config)


def test_a_streamed_datasets_shuffle_buffer_is_positive():
  """tf.data refuses 0 and -1 only when the pipeline is built, after config.json."""
  config = with_value(imagenet_config.get_config(), 'dataset.shuffle_buffer', -1)
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(config)
  assert str(e.value) == (
    'config.dataset.shuffle_buffer=-1 is not valid; it must be an integer > 0'
  )


def test_a_field_may_allow_infinity_never_nan():
  field = fields.Field('train.patience', above=0, allow_inf=True)
  field.check({'train': {'patience': math.inf}})
  with pytest.raises(
    fields.ConfigError,
    match=r'^config.train.patience=nan is not valid; it '
    r'must be a number \(not NaN\) > 0$',
  ):
    field.check({'train': {'patience': math.nan}})


@pytest.mark.parametrize('value', [1.0, True, None, 'x'])
def test_an_integer_field_holds_an_int(value):
  field = fields.Field('train.seed', minimum=0, integer=True)
  field.check({'train': {'seed': 3}})
  with pytest.raises(fields.ConfigError) as e:
    field.check({'train': {'seed': value}})
  assert str(e.value) == f'config.train.seed={value!r} is not valid; it must be an integer >= 0'


def test_an_implementation_this_platform_cannot_run_writes_nothing(tmp_path):
  """`--config.attention.options.implementation=pallas` for softmax on a CPU passed
  validation, wrote config.json and checkpoints/, then crashed in a 67-line traceback
  (issue 70, item 9); the rerun without it was then refused as another config."""
  config = with_value(default_config.get_config(), 'attention.options.implementation', 'pallas')
  workdir = tmp_path / 'run'
  with pytest.raises(validate.ConfigError, match=r"^implementation='pallas' cannot run") as e:
    trainer.train_and_evaluate(config, str(workdir))
  assert len(str(e.value).splitlines()) == 1
  assert not workdir.exists()


def test_a_bad_mesh_is_refused_before_a_generated_dataset_is_written(tmp_path):
  """A bad mesh on MQAR was refused only after 100,000 examples were generated (issue 70,
  item 13): the mesh is checked before the data is prepared."""
  config = mqar_config.get_config('linear')
  config.dataset.data_dir = str(tmp_path / 'cache')
  config.train.mesh = {'data': jax.device_count() + 1}
  with pytest.raises(validate.ConfigError, match=r'^config\.train\.mesh=.* needs \d+ devices'):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'cache').exists() and not (tmp_path / 'run').exists()

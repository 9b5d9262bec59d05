"""Each concern checks its own config fields (`fields`), alone, with one-line errors."""

import pytest

from configs import default as default_config
from configs import fields
from train import adapters
from train import modeling
from train import optim


@pytest.mark.parametrize(
  'path, value, message',
  [
    ('optim.name', 'adam', "config.optim.name='adam' is not valid; valid choices: adamw, sgd"),
    ('optim.learning_rate', 0.0, 'config.optim.learning_rate=0.0 is not valid; it must be > 0'),
    ('optim.grad_clip', -1.0, 'config.optim.grad_clip=-1.0 is not valid; it must be >= 0'),
    ('optim.b2', 1.0, 'config.optim.b2=1.0 is not valid; it must be in [0, 1)'),
  ],
)
def test_optim_checks_its_own_fields(path, value, message):
  config = default_config.get_config()
  optim.check(config)
  group, name = path.split('.')
  config[group][name] = value
  with pytest.raises(fields.ConfigError) as e:
    optim.check(config)
  assert str(e.value) == message


def test_model_and_adapters_check_their_own_fields():
  config = default_config.get_config()
  modeling.check(config)
  decl, options = modeling.check_attention(config)
  assert decl.name == config.attention.mechanism and options == decl.resolve()
  config.model.attention_dropout_rate = 1.0
  with pytest.raises(
    fields.ConfigError,
    match=r'^config.model.attention_dropout_rate=1.0 is '
    r'not valid; it must be in \[0, 1\)$',
  ):
    modeling.check(config)
  config = default_config.get_config()
  config.lora.rank = -1
  with pytest.raises(
    fields.ConfigError,
    match=r'^config.lora.rank=-1 is not valid; it must be '
    r'>= 0 \(0 = off\)$',
  ):
    adapters.check(config)


def test_a_field_the_config_may_leave_out_takes_its_default():
  field = fields.Field('sample.num_samples', minimum=0, note='(0 = none)', default=0)
  config = default_config.get_config()
  assert 'sample' not in config and field.value(config) == 0
  field.check(config)
  config.sample = {'num_samples': -2}
  with pytest.raises(
    fields.ConfigError,
    match=r'^config.sample.num_samples=-2 is not valid; '
    r'it must be >= 0 \(0 = none\)$',
  ):
    field.check(config)

"""The data package checks its own config (`data.check`, `data.check_splits`): one-line
ValueErrors, the messages `train.validate` gives as ConfigError."""

import ml_collections
import pytest

from configs import common
from configs import presets
import data
from train import validate


def _digits(**changes):
  config = presets.digits(common.base())
  config.dataset.update(changes)
  return config


@pytest.mark.parametrize(
  'changes, message',
  [
    ({'batch_size': 0}, 'config.dataset.batch_size=0 is not valid; it must be > 0'),
    ({'name': 'digitz'}, "config.dataset.name='digitz' is not valid; valid choices: digits,"),
    (
      {'augment': 'inception_crop'},
      "config.dataset.augment='inception_crop' is not valid for "
      "the in-memory dataset 'digits' from 'sklearn'",
    ),
    (
      {'num_classes': 3},
      "config.dataset.num_classes=3 is not valid for 'digits'; valid choices: 10",
    ),
  ],
)
def test_check_names_the_field_alone_and_through_validate(changes, message):
  config = _digits(**changes)
  with pytest.raises(ValueError) as alone:
    data.check(config)
  assert str(alone.value).startswith(message) and '\n' not in str(alone.value)
  with pytest.raises(validate.ConfigError) as through:
    validate.validate_config(config)
  assert str(through.value) == str(alone.value)


def test_check_splits_fills_num_classes_and_fits_the_batch():
  config = ml_collections.ConfigDict(_digits(num_classes=0).to_dict())
  data.check_splits(config)
  assert config.dataset.num_classes == 10
  config.dataset.batch_size = 2000
  with pytest.raises(
    ValueError,
    match=r"^config.dataset.batch_size=2000 exceeds the 1437 "
    r"examples of split 'train'; valid: <= 1437$",
  ):
    data.check_splits(config)
  data.check_splits(config, training=False)  # evaluation reads no training batch

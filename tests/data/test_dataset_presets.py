"""Each dataset's facts are written once, in its `DatasetSpec` (`data/specs.py`): the
config presets (`configs/presets.py`) read them, so a preset cannot disagree with its spec."""

import dataclasses
import glob
import importlib
import inspect
import os

import pytest

from configs import common
from configs import presets
from data import specs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESETS = {
  'digits': presets.digits,
  'mnist': presets.mnist,
  'cifar10': presets.cifar10,
  'cifar100': presets.cifar100,
  'imagenet2012': presets.imagenet,
  'imdb_reviews': presets.imdb,
  'aan': presets.aan,
  'listops': presets.listops,
  'pathfinder': presets.pathfinder,
  'mqar': presets.mqar,
  'sequences': presets.sequences,
  'image_folder': presets.image_folder,
  'text_bytes': presets.text_bytes,
}


def test_every_dataset_has_a_preset():
  assert set(PRESETS) == set(specs.DATASETS)


@pytest.mark.parametrize('name', sorted(PRESETS))
def test_a_preset_follows_its_spec(name, monkeypatch):
  """A spec with other facts gives a preset with those facts: the preset holds none."""
  spec = specs.get_spec(name)
  other = dataclasses.replace(
    spec, num_classes=spec.num_classes + 7, channels=5, mean=(), std=(), default_source='arrays'
  )
  monkeypatch.setitem(specs.DATASETS, name, other)
  d = PRESETS[name](common.base()).dataset
  assert d.name == name
  assert (d.num_classes, d.channels) == (spec.num_classes + 7, 5)
  assert d.source in ('', 'arrays')  # a preset that names a source names the spec's


def test_the_default_dataset_and_pixel_sizes_come_from_the_specs(monkeypatch):
  for name, size in (('digits', 6), ('mnist', 20)):
    spec = specs.get_spec(name)
    monkeypatch.setitem(
      specs.DATASETS, name, dataclasses.replace(spec, num_classes=3, stored_size=size)
    )
    assert presets.pixel_lm(PRESETS[name](common.base())).dataset.image_size == size
  assert common.base().dataset.num_classes == 3  # base() is the digits preset


def test_shipped_configs_agree_with_their_specs():
  """Every config in configs/ (default argument): num_classes is its dataset's."""
  for path in sorted(glob.glob(os.path.join(ROOT, 'configs', '**', '*.py'), recursive=True)):
    module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
    config_module = importlib.import_module(module)
    if not hasattr(config_module, 'get_config'):
      continue
    get_config = config_module.get_config
    d = (get_config(None) if inspect.signature(get_config).parameters else get_config()).dataset
    spec = specs.get_spec(d.name)
    assert d.num_classes == spec.num_classes, module


def test_a_spec_whose_normalisation_misses_channels_is_refused():
  with pytest.raises(
    ValueError,
    match=r"DatasetSpec 'x': mean=\(0.5,\) has 1 values; "
    r'channels=3 needs 3',
  ):
    specs.DatasetSpec('x', 'image', 2, 3, (0.5,), (0.2, 0.2, 0.2))

"""Bad input fails before training, with a message naming the field, value and choices.

`test_train.py` checks the validation messages field by field; here the
trainer and `main.py` must stop before reading data, creating the workdir or
compiling a step, and the fixed-length mechanisms refuse longer sequences in
the library as well as in the config.
"""

import os
import subprocess
import sys

import helpers
import jax
import jax.numpy as jnp
import pytest

from configs import default as default_config
from configs import imdb as imdb_config
from configs import presets
import data
from data import splits
from efficient_attn import models as ea_models
from train import trainer
from train import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def no_data(monkeypatch):
  """Fails the test if anything reads or prepares a dataset."""

  def touched(*args, **kwargs):
    raise AssertionError('the dataset was touched before the config was rejected')

  for name in ('prepare', 'get_train_data', 'get_eval_data'):
    monkeypatch.setattr(data, name, touched)
  monkeypatch.setattr(splits, 'prepare', touched)  # what data.check_splits calls


def with_overrides(config, overrides):
  for path, value in overrides.items():
    group, _, name = path.rpartition('.')
    (config[group] if group else config)[name] = value
  return config


NAME_ERRORS = [  # (overrides of the default config, fragments of the message)
  (
    {'attention.mechanism': 'flash'},
    ["config.attention.mechanism='flash'", 'softmax, softmax_chunked', 'linear', 'local'],
  ),
  (
    {'attention.projection': 'shared'},
    ["config.attention.projection='shared'", 'standard, optimised, efficient, super'],
  ),
  (
    {'dataset.name': 'svhn'},
    ["config.dataset.name='svhn'", 'digits, mnist, cifar10', 'image_folder'],
  ),
  ({'model.kind': 'resnet'}, ["config.model.kind='resnet'", 'vit, text']),
  (
    {'model.num_heads': 5},
    [
      'config.model.num_heads=5',
      'config.model.d_model=64',
      'valid choices: 1, 2, 4, 8, 16, 32, 64',
    ],
  ),
  (
    {'attention.num_kv_heads': 3},
    ['config.attention.num_kv_heads=3', 'num_heads (4) must be divisible by num_kv_heads (3)'],
  ),
]


@pytest.mark.parametrize(
  'overrides,fragments', NAME_ERRORS, ids=[next(iter(overrides)) for overrides, _ in NAME_ERRORS]
)
def test_trainer_rejects_before_any_work(overrides, fragments, tmp_path, no_data):
  del no_data
  workdir = tmp_path / 'run'
  config = with_overrides(default_config.get_config(), overrides)
  with pytest.raises(validate.ConfigError) as e:
    trainer.train_and_evaluate(config, str(workdir))
  for fragment in fragments:
    assert fragment in str(e.value), (fragment, str(e.value))
  assert not workdir.exists()


@pytest.mark.parametrize(
  'mechanism,projection,what',
  [
    ('linformer', 'standard', "mechanism 'linformer'"),
    ('softmax', 'super', "projection 'super'"),
  ],
)
def test_config_sequence_longer_than_fixed_length(mechanism, projection, what, no_data):
  del no_data
  config = imdb_config.get_config(f'{mechanism},projection={projection},max_length=600')
  config.model.max_length = 512  # the length-shaped weights are built for 512 tokens
  with pytest.raises(validate.ConfigError) as e:
    trainer.train_and_evaluate(config, '/nonexistent/never-created')
  message = str(e.value)
  for fragment in (
    'sequence length 600',
    'config.dataset.max_length=600',
    'fixed context length 512',
    what,
    'config.model.max_length=512',
    'valid: lengths <= 512',
  ):
    assert fragment in message, (fragment, message)
  config.model.max_length = 600  # and the same length fits
  validate.validate_config(config)


@pytest.mark.parametrize('mechanism,projection', [('linformer', 'standard'), ('softmax', 'super')])
def test_model_sequence_longer_than_fixed_length(mechanism, projection):
  """The library refuses too (a model built for 16 tokens fed 24)."""
  model = ea_models.TextClassifier(
    ea_models.TransformerConfig(
      max_length=16,
      d_model=16,
      depth=1,
      num_heads=2,
      mlp_dim=32,
      mechanism=mechanism,
      projection=projection,
      options={'k_proj': 4} if mechanism == 'linformer' else {},
    ),
    vocab_size=257,
    num_classes=2,
    pool='mean',
  )
  params = model.init(jax.random.key(0), jnp.ones((1, 16), jnp.int32))
  model.apply(params, jnp.ones((1, 16), jnp.int32))
  with pytest.raises(ValueError, match='input length 24 exceeds max_length=16'):
    model.apply(params, jnp.ones((1, 24), jnp.int32))


def test_missing_tfds_data_without_download(tmp_path):
  config = presets.mnist(default_config.get_config())
  config.model.patch_size = 4
  config.dataset.update(dict(data_dir=str(tmp_path / 'nowhere'), download=False))
  with pytest.raises(validate.ConfigError, match=r"data_dir='.*nowhere' does not exist"):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  config.dataset.data_dir = str(tmp_path)  # exists, holds no mnist
  with pytest.raises(validate.ConfigError) as e:
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  for fragment in (
    "dataset 'mnist' is not prepared",
    f"data_dir='{tmp_path}'",
    'config.dataset.download=True',
  ):
    assert fragment in str(e.value), (fragment, str(e.value))
  assert not (tmp_path / 'run').exists()


def test_missing_image_folder(tmp_path, image_folder_root):
  config = presets.image_folder(default_config.get_config(), root=str(tmp_path / 'photos'))
  with pytest.raises(validate.ConfigError, match=r"data_dir='.*photos' is not a directory"):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  config.dataset.update(dict(data_dir=image_folder_root, eval_split='validation'))
  with pytest.raises(
    validate.ConfigError,
    match=r"eval_split='validation' is not a folder "
    r'.*valid choices: test, train',
  ):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize(
  'flags,message',
  [
    (
      ['--config=configs/default.py', '--config.model.num_heads=3'],
      'Invalid config: config.model.num_heads=3 does not divide config.model.d_model=64; '
      'valid choices: 1, 2, 4, 8, 16, 32, 64',
    ),
    (
      ['--config=configs/image_folder.py', '--config.dataset.data_dir=/nonexistent/photos'],
      "Invalid config: config.dataset.data_dir='/nonexistent/photos' is not a directory",
    ),
  ],
)
@pytest.mark.slow
def test_main_exits_nonzero_with_the_message_and_no_traceback(flags, message, tmp_path):
  workdir = tmp_path / 'run'
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  proc = subprocess.run(
    [sys.executable, 'main.py', f'--workdir={workdir}', *flags],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr[-2000:]
  assert proc.stderr.count(message) == 1, proc.stderr[-2000:]  # said once, not logged too
  assert 'Traceback' not in proc.stderr
  assert not workdir.exists()


@pytest.mark.slow
def test_main_says_a_bad_field_before_the_workdir_line():
  """A misspelt mechanism is refused before `workdir runs/...` is printed (which read as if
  the folder had been made)."""
  proc = subprocess.run(
    [
      sys.executable,
      'main.py',
      '--config=configs/default.py',
      '--config.attention.mechanism=nystrm',
    ],
    cwd=ROOT,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 1
  assert proc.stdout == ''
  assert (
    proc.stderr.strip()
    .splitlines()[-1]
    .startswith("Invalid config: config.attention.mechanism='nystrm' is not valid")
  ), proc.stderr[-2000:]


def test_retrieval_without_its_files(tmp_path):
  """LRA Retrieval cannot be generated: no folder, a missing folder, a bad interaction are
  one-line errors before the workdir is written."""
  config = helpers.load_config('configs/lra/retrieval.py', 'linear,size=small')
  with pytest.raises(validate.ConfigError, match="data_dir='' is not valid .* new_aan_pairs"):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  config.dataset.data_dir = str(tmp_path / 'tsv_data')
  with pytest.raises(validate.ConfigError, match=r"data_dir='.*tsv_data': no such folder"):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  config.model.interaction = 'dot'
  with pytest.raises(validate.ConfigError, match="interaction='dot' is not valid.*concat, nli"):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_positions_only_on_text_models():
  config = default_config.get_config()  # a ViT
  config.model.positions = 'sinusoidal'
  with pytest.raises(
    validate.ConfigError,
    match="positions='sinusoidal' is not valid for config.model.kind='vit'.*valid choices: learned",
  ):
    validate.validate_config(config)
  config.model.positions = 'rope'
  with pytest.raises(validate.ConfigError, match="positions='rope' is not valid"):
    validate.validate_config(config)

"""The 'pixel_lm' task end to end: pixel-token pipelines, training, samples, decoding."""

import json
import math
import os

import helpers
import jax
import numpy as np
import pytest

from benchmarks import generation
from configs import digits_pixels
from configs import mnist_pixels
import data
from data import arrays
from data import transforms
from efficient_attn.models.causal import shift_right
from train import inference
from train import samples
from train import trainer
from train import validate

PNG = b'\x89PNG\r\n\x1a\n'


def tiny_config(mechanism='linear'):
  config = digits_pixels.get_config(mechanism)
  config.model.update(dict(d_model=32, depth=2, num_heads=2, mlp_dim=64))
  config.dataset.update(dict(batch_size=32, eval_batch_size=120))
  config.train.update(dict(num_steps=30, log_every=10, checkpoint_every=30))
  config.optim.warmup_steps = 5
  config.sample.update(dict(num_samples=4, num_completions=3))
  return config


@pytest.fixture(scope='module')
def run(run_once):
  workdir = run_once('pixel_lm_linear', lambda d: trainer.train_and_evaluate(tiny_config(), d))
  with open(os.path.join(workdir, 'results.json')) as f:
    return workdir, json.load(f)


def test_digits_pixel_tokens():
  config = tiny_config()
  batch = next(data.get_train_data(config).batches(0))
  tokens = batch['inputs']
  assert tokens.shape == (32, 64) and tokens.dtype == np.int32
  levels = np.round(np.arange(17) * 255 / 16)
  assert set(np.unique(tokens)) <= set(levels) and tokens.max() == 255
  eval_tokens = data.get_eval_batch(config)['inputs']
  images = arrays.load_digits()['test'].inputs[:120, ..., 0]
  np.testing.assert_array_equal(eval_tokens, np.round(images).reshape(120, 64))
  config.dataset.transform = 'rotated'  # on the 8x8 image, not the token row
  rotated = data.get_eval_batch(config)['inputs']
  want = np.asarray(transforms.rotate(eval_tokens.reshape(-1, 8, 8))).reshape(-1, 64)
  np.testing.assert_array_equal(rotated, want)


def test_mnist_pixel_tokens_from_tfds():
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  config = mnist_pixels.get_config('linear')
  config.dataset.update(dict(batch_size=4, eval_batch_size=4, shuffle_buffer=8))
  with tfds.testing.mock_data(num_examples=8):
    tokens = next(data.get_train_data(config).batches(0))['inputs']
    eval_tokens = data.get_eval_batch(config)['inputs']
  for t in (tokens, eval_tokens):
    assert t.shape == (4, 784) and t.dtype == np.int32
    assert t.min() >= 0 and t.max() <= 255


@pytest.mark.slow
def test_training_metrics_and_sample_pngs(run):
  workdir, results = run
  assert results['task'] == 'pixel_lm' and results['model'] == 'causal'
  for split in ('train', 'eval'):
    loss = results[f'{split}_loss']
    assert math.log(256) > loss > 0  # learned something within 30 steps
    assert results[f'{split}_bits_per_dim'] == pytest.approx(loss / math.log(2))
    assert results[f'{split}_nll'] == pytest.approx(loss * 64)
    assert 0 <= results[f'{split}_accuracy'] <= 1
  assert results['params_trainable'] == results['params_total']
  for name in ('samples.png', 'samples_completion.png'):
    with open(os.path.join(workdir, name), 'rb') as f:
      assert f.read(8) == PNG


@pytest.mark.slow
def test_eval_mode_writes_samples(run, tmp_path):
  workdir, results = run
  os.remove(os.path.join(workdir, 'samples.png'))
  values = trainer.evaluate(tiny_config(), workdir)
  assert values['bits_per_dim'] == pytest.approx(results['eval_bits_per_dim'], rel=1e-5)
  assert os.path.exists(os.path.join(workdir, 'samples.png'))


@pytest.mark.slow
def test_no_unconditional_samples_writes_only_completions(run, tmp_path):
  workdir, _ = run
  config, model, params = inference.load(workdir)
  images = np.asarray(data.get_eval_batch(config)['inputs'][:2]).reshape(2, 8, 8)
  paths = samples.write_samples(
    model,
    jax.device_get(params),
    jax.random.key(0),
    str(tmp_path),
    image_shape=(8, 8),
    num_samples=0,
    images=images,
  )
  assert list(paths) == ['completion'] and os.listdir(tmp_path) == ['samples_completion.png']


@pytest.mark.slow
def test_recurrent_decoding_of_the_checkpoint_equals_parallel(run):
  workdir, _ = run
  config, model, params = inference.load(workdir)
  pixels = data.get_eval_batch(config)['inputs'][:2]
  helpers.assert_decode_matches_parallel(
    model, jax.device_get(params), shift_right(pixels, model.start_token)
  )


@pytest.mark.slow
def test_generation_benchmark_reads_the_checkpoint(run, tmp_path):
  workdir, results = run
  result = generation.main(
    [
      f'--workdir={workdir}',
      '--num_images=2',
      '--mechanisms=linear',
      f'--out={tmp_path}',
      '--quiet',
    ]
  )
  assert result['length'] == 64 and result['num_params'] == results['params_total']
  assert result['config']['d_model'] == 32
  with open(tmp_path / 'generation.md') as f:
    assert f'weights from {workdir}' in f.read()


@pytest.mark.parametrize(
  'overrides,fragments',
  [
    (
      {'attention.mechanism': 'nystrom'},
      ["mechanism='nystrom' is not valid for the causal model kind", 'linear', 'softmax'],
    ),
    ({'model.kind': 'vit'}, ["model.kind='vit'", 'pixel-token', 'causal']),
    ({'dataset.pixels_as_tokens': False}, ["model.kind='causal'", 'vit']),
    ({'task': 'classification'}, ["model.kind='causal'", "task='classification'", 'vit']),
    ({'dataset.transform': 'blur'}, ["transform='blur'", 'rotate']),
    ({'sample.num_samples': -1}, ['config.sample.num_samples=-1', '>= 0']),
  ],
)
def test_bad_pixel_configs(overrides, fragments):
  config = tiny_config()
  for field, value in overrides.items():
    group, _, name = field.rpartition('.')
    (config[group] if group else config)[name] = value
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(config)
  for fragment in fragments:
    assert fragment in str(e.value), (fragment, str(e.value))

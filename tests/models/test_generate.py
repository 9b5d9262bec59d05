"""Sampling (`efficient_attn.models.sampling`), occluded completion and image grids (`train.samples`)."""

import functools
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest

from efficient_attn.models import CausalTransformer
from efficient_attn.models import TransformerConfig
from efficient_attn.models import sampling
from efficient_attn.models.causal import shift_right
from train import samples

SIDE, B = 6, 3


@functools.lru_cache(maxsize=None)
def _model(mechanism):
  model = CausalTransformer(
    TransformerConfig(
      max_length=SIDE * SIDE, d_model=16, depth=1, num_heads=2, mlp_dim=32, mechanism=mechanism
    )
  )
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, SIDE * SIDE), jnp.int32))[
    'params'
  ]
  return model, params, sampling.make_sampler(model, B)


@pytest.mark.parametrize('mechanism', ['linear', 'softmax'])
def test_samples_are_pixels_and_depend_on_rng(mechanism):
  model, params, sampler = _model(mechanism)
  a = sampler(params, jax.random.PRNGKey(1))
  b = sampler(params, jax.random.PRNGKey(2))
  assert a.shape == (B, SIDE * SIDE) and a.dtype == jnp.int32
  assert int(a.min()) >= 0 and int(a.max()) < model.vocab_size
  assert not np.array_equal(a, b)
  np.testing.assert_array_equal(a, sampler(params, jax.random.PRNGKey(1)))


@pytest.mark.parametrize('mechanism', ['linear', 'softmax'])
def test_low_temperature_is_greedy(mechanism):
  model, params, sampler = _model(mechanism)
  greedy = sampler(params, jax.random.PRNGKey(1), temperature=0.0)
  np.testing.assert_array_equal(sampler(params, jax.random.PRNGKey(7), temperature=1e-4), greedy)
  # Greedy tokens are the argmax of the parallel forward pass on themselves.
  logits = model.apply({'params': params}, shift_right(greedy, model.start_token))
  np.testing.assert_array_equal(jnp.argmax(logits, -1), greedy)


def test_sample_logits():
  logits = jnp.array([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
  np.testing.assert_array_equal(sampling.sample_logits(jax.random.PRNGKey(0), logits, 0.0), [1, 0])
  draws = jax.vmap(lambda k: sampling.sample_logits(k, logits, 1.0))(
    jax.random.split(jax.random.PRNGKey(0), 2000)
  )
  freq = np.mean(np.asarray(draws[:, 0]) == 1)
  np.testing.assert_allclose(freq, jax.nn.softmax(logits[0])[1], atol=0.03)


def test_occluded_completion_keeps_the_prefix():
  model, params, sampler = _model('linear')
  images = np.random.RandomState(0).randint(0, 256, (B, SIDE, SIDE)).astype(np.uint8)
  rows = 2
  out = sampler(
    params,
    jax.random.PRNGKey(3),
    prefix=samples.images_to_tokens(images),
    prefix_length=rows * SIDE,
  )
  done = samples.tokens_to_images(out, (SIDE, SIDE))
  np.testing.assert_array_equal(done[:, :rows], images[:, :rows])
  assert not np.array_equal(done[:, rows:], images[:, rows:])


def test_pngs_written(tmp_path):
  model, params, _ = _model('linear')
  images = np.random.RandomState(0).randint(0, 256, (2, SIDE, SIDE)).astype(np.uint8)
  paths = samples.write_samples(
    model,
    params,
    jax.random.PRNGKey(0),
    str(tmp_path),
    image_shape=(SIDE, SIDE),
    num_samples=B,
    images=images,
    rows=3,
  )
  assert set(paths) == {'samples', 'completion'}
  for path in paths.values():
    assert os.path.getsize(path) > 0
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  zoom = 64 // SIDE
  grid = plt.imread(paths['completion'])  # 3 rows (original, occluded, completed) x 2
  assert grid.shape[:2] == ((3 * (SIDE + 1) - 1) * zoom, (2 * (SIDE + 1) - 1) * zoom)


def test_tile_and_occlude():
  images = np.arange(5 * 2 * 3).reshape(5, 2, 3).astype(np.uint8)
  grid = samples.tile(images, ncols=3, pad=1, pad_value=255)
  assert grid.shape == (2 * 3 - 1, 3 * 4 - 1)
  np.testing.assert_array_equal(grid[3:5, 4:7], images[4])
  occluded = samples.occlude(images, 1)
  assert (occluded[:, 1:] == 0).all() and (occluded[:, :1] == images[:, :1]).all()

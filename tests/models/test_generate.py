"""Sampling (`efficient_attn.models.sampling`), occluded completion and image grids
(`train.samples`), and `efficient_attn.models.generate`: prefill then decoding steps."""

import functools
import os

import flax
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest

from efficient_attn import registry
from efficient_attn.models import CausalTransformer
from efficient_attn.models import TransformerConfig
from efficient_attn.models import generate
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
  logits = jax.jit(model.apply)({'params': params}, shift_right(greedy, model.start_token))
  np.testing.assert_array_equal(jnp.argmax(logits, -1), greedy)


def test_sample_logits():
  logits = jnp.array([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
  sample = jax.jit(sampling.sample_logits)  # a traced temperature: one program for both
  np.testing.assert_array_equal(sample(jax.random.PRNGKey(0), logits, 0.0), [1, 0])
  draws = jax.vmap(lambda k: sample(k, logits, 1.0))(jax.random.split(jax.random.PRNGKey(0), 2000))
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


# generate(): prefill, decoding steps in a while loop, ragged prompts, end tokens.

GEN_LENGTH, VOCAB = 16, 11
PROMPT = np.asarray([[11, 3, 4, 5, 6], [11, 7, 0, 0, 0], [11, 1, 9, 0, 0]], np.int32)
LENGTHS = [5, 2, 3]  # right-padded
NEW = 8


@functools.lru_cache(maxsize=None)
def _lm(mechanism):
  options = flax.core.FrozenDict(registry.get_mechanism(mechanism).example)  # hashable
  model = CausalTransformer(
    TransformerConfig(
      max_length=GEN_LENGTH,
      d_model=16,
      depth=1,
      num_heads=2,
      mlp_dim=32,
      mechanism=mechanism,
      options=options,
    ),
    vocab_size=VOCAB,
  )
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, GEN_LENGTH), jnp.int32))
  return model, params['params']


# One mechanism per decoding form: a key/value cache, a window's ring buffer (wrapping
# here), a recurrent state, a recurrent state with a short convolution.
@pytest.mark.parametrize('mechanism', ['softmax', 'local', 'linear', 'gated_deltanet'])
def test_greedy_generation_is_the_argmax_of_the_parallel_pass(mechanism):
  model, params = _lm(mechanism)
  out = model.generate(params, PROMPT, NEW, temperature=0.0, prompt_lengths=LENGTHS)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  assert tokens.shape == (3, NEW) and lengths.tolist() == [NEW] * 3
  apply = jax.jit(model.apply)  # one program per row's length
  for row, length in enumerate(LENGTHS):  # each row as if alone: its own positions
    sequence = np.concatenate([PROMPT[row, :length], tokens[row]])[None]
    logits = apply({'params': params}, jnp.asarray(sequence))
    np.testing.assert_array_equal(
      np.argmax(logits[0, length - 1 : length - 1 + NEW], -1), tokens[row], err_msg=f'row {row}'
    )


# The whole prompt in one prefill call (every row as long), the state then stepped: a
# window that wraps during the prefill, and a short convolution's taps across its end.
@pytest.mark.parametrize('mechanism', ['local', 'gated_deltanet'])
def test_a_prompt_prefilled_whole_continues_as_the_parallel_pass(mechanism):
  model, params = _lm(mechanism)
  prompt = np.asarray([[11, 3, 4, 5, 6], [11, 7, 2, 9, 1]], np.int32)
  tokens = np.asarray(model.generate(params, prompt, NEW, temperature=0.0).tokens)
  logits = jax.jit(model.apply)(
    {'params': params}, jnp.asarray(np.concatenate([prompt, tokens], 1))
  )
  np.testing.assert_array_equal(np.argmax(logits[:, 4 : 4 + NEW], -1), tokens)


def test_rows_stop_at_their_end_token_and_the_rest_is_filled():
  model, params = _lm('linear')
  free = np.asarray(
    model.generate(params, PROMPT, NEW, temperature=0.0, prompt_lengths=LENGTHS).tokens
  )
  eos = int(free[1, 2])  # row 1 ends at its third new token (or earlier, on the same token)
  out = model.generate(params, PROMPT, NEW, temperature=0.0, prompt_lengths=LENGTHS, eos_id=eos)
  out_tokens, out_lengths = np.asarray(out.tokens), np.asarray(out.lengths)  # no eager slicing
  for row in range(3):
    hits = np.flatnonzero(free[row] == eos)
    length = int(hits[0]) + 1 if len(hits) else NEW
    assert int(out_lengths[row]) == length, row
    np.testing.assert_array_equal(out_tokens[row, :length], free[row, :length])
    assert (out_tokens[row, length:] == eos).all()
  assert int(out_lengths[1]) <= 3


def test_sampling_depends_on_the_key_and_top_k_1_is_greedy():
  model, params = _lm('softmax')
  sample = lambda key, **o: np.asarray(
    model.generate(params, PROMPT, NEW, prompt_lengths=LENGTHS, rng=jax.random.key(key), **o).tokens
  )
  a = sample(1, temperature=1.0)
  np.testing.assert_array_equal(a, sample(1, temperature=1.0))
  assert not np.array_equal(a, sample(2, temperature=1.0))
  assert ((a >= 0) & (a < VOCAB)).all()
  greedy = model.generate(params, PROMPT, NEW, temperature=0.0, prompt_lengths=LENGTHS).tokens
  np.testing.assert_array_equal(sample(3, temperature=1.0, top_k=1), greedy)
  np.testing.assert_array_equal(sample(4, temperature=1.0, top_p=1e-6), greedy)


@pytest.mark.parametrize(
  'mechanism, arguments, message',
  [
    (
      'bigbird',
      {},
      "generate: mechanism 'bigbird' has no decoding form; mechanisms that can decode: softmax",
    ),
    ('linear', dict(max_new_tokens=13), 'take 17 positions; the model has max_length=16'),
    ('linear', dict(prompt_lengths=[5, 0, 3]), 'do not fit the prompt [3, 5]'),
    ('linear', dict(prompt_lengths=[5, 6, 3]), 'valid: [batch] lengths in 1..5'),
    ('linear', dict(temperature=0.5), 'temperature=0.5 samples and needs an rng'),
    ('linear', dict(top_p=0.0, temperature=0.0), 'top_p=0.0 is not valid'),
    ('linear', dict(top_k=-2, temperature=0.0), 'top_k=-2 is not valid'),
    ('linear', dict(max_new_tokens=0), 'max_new_tokens=0 is not valid; it must be >= 1'),
  ],
)
def test_what_generate_cannot_do_is_one_line(mechanism, arguments, message):
  model = CausalTransformer(
    TransformerConfig(max_length=GEN_LENGTH, d_model=16, depth=1, num_heads=2, mechanism=mechanism),
    vocab_size=VOCAB,
  )
  arguments = {'max_new_tokens': NEW, 'prompt_lengths': LENGTHS, **arguments}
  with pytest.raises(ValueError) as e:
    generate.generate(model, {}, PROMPT, **arguments)
  assert message in str(e.value) and '\n' not in str(e.value), e.value

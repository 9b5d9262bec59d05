"""Decoding one token at a time equals the parallel causal forward pass."""

import functools

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn.layers import decoding
from efficient_attn.models import CausalTransformer
from efficient_attn.models import TransformerConfig
from efficient_attn.models import sampling
from efficient_attn.models.causal import shift_right
from efficient_attn.ops import rotary

B, L, D, H = 2, 70, 16, 2  # L > decoding.KV_BLOCK: the cache spans several blocks
DECODABLE = decoding.decodable_mechanisms()


def _decode_layer(layer, variables, x):
  """Outputs `[B, L, ...]` of `layer.clone(decode=True)` fed x one token at a time."""
  dec = layer.clone(decode=True)
  cache = helpers.empty_cache(dec, variables, x)
  step = jax.jit(lambda c, xt: dec.apply({**variables, **c}, xt, mutable=['cache']))
  outs = []
  for t in range(x.shape[1]):
    y, cache = step(cache, x[:, t : t + 1])
    outs.append(y)
  return jnp.concatenate(outs, axis=1)


@pytest.mark.parametrize('mechanism', DECODABLE)
def test_layer_decode_matches_parallel(mechanism):
  x = jax.random.normal(jax.random.PRNGKey(0), (B, L, D))
  layer = ea.MultiHeadAttention(
    num_heads=H, mechanism=mechanism, causal=True, options=ea.get_mechanism(mechanism).example
  )
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  np.testing.assert_allclose(
    _decode_layer(layer, variables, x), jax.jit(layer.apply)(variables, x), atol=2e-5, rtol=2e-5
  )


def test_taylor_linear_attention_decodes_from_a_state_of_its_feature_width():
  """The Taylor map widens head_dim d to 1 + d + d^2 features: the decoding state is
  built that wide (`Mechanism.feature_dim`) and decoding equals the parallel form."""
  x = jax.random.normal(jax.random.PRNGKey(0), (B, 12, D))
  layer = ea.MultiHeadAttention(
    num_heads=H, mechanism='linear', causal=True, options={'feature_map': 'taylor', 'chunk_size': 5}
  )
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  np.testing.assert_allclose(
    _decode_layer(layer, variables, x), jax.jit(layer.apply)(variables, x), atol=2e-5, rtol=2e-5
  )
  cache = helpers.empty_cache(layer.clone(decode=True), variables, x)
  d = D // H
  assert (B, H, 1 + d + d * d, d) in [leaf.shape for leaf in jax.tree.leaves(cache)]
  with pytest.raises(
    ValueError,
    match="rotary positions cannot rotate the 'taylor' feature "
    "map's 1 \\+ d \\+ d\\^2 features .*valid: rotary=False",
  ):
    layer.clone(rotary=True).init(jax.random.PRNGKey(1), x)


def test_based_linear_attention_projects_queries_and_keys_to_qk_dim():
  """Based's layout: queries and keys of qk_dim features per head (values keep head_dim),
  Taylor features of them in the state; decoding equals the parallel form; a projection
  scheme without a key projection is refused in one line."""
  x = jax.random.normal(jax.random.PRNGKey(0), (B, 12, D))
  options = {'feature_map': 'taylor', 'qk_dim': 3, 'chunk_size': 5}
  layer = ea.MultiHeadAttention(num_heads=H, mechanism='linear', causal=True, options=options)
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  kernels = variables['params']
  assert kernels['query']['kernel'].shape == kernels['key']['kernel'].shape == (D, H, 3)
  assert kernels['value']['kernel'].shape == (D, H, D // H)
  np.testing.assert_allclose(
    _decode_layer(layer, variables, x), jax.jit(layer.apply)(variables, x), atol=2e-5, rtol=2e-5
  )
  cache = helpers.empty_cache(layer.clone(decode=True), variables, x)
  assert (B, H, 1 + 3 + 9, D // H) in [leaf.shape for leaf in jax.tree.leaves(cache)]
  with pytest.raises(ValueError, match="needs a key projection: projection 'efficient'") as e:
    ea.MultiHeadAttention(
      num_heads=H, mechanism='linear', causal=True, options=options, projection='efficient'
    ).init(jax.random.PRNGKey(1), x)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('mechanism', ['linear', 'softmax'])
def test_super_projection_decode_matches_parallel(mechanism):
  x = jax.random.normal(jax.random.PRNGKey(0), (B, 20, D))
  layer = ea.MultiHeadAttention(
    num_heads=H, mechanism=mechanism, projection='super', causal=True, max_length=24
  )
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  # A non-trivial lower-triangular W_A (it starts as the identity).
  params = jax.tree.map(lambda p: p, variables['params'])
  params['alignment']['kernel'] = jax.random.normal(jax.random.PRNGKey(2), (24, 24)) / 4
  params['alignment']['bias'] = jnp.linspace(-1, 1, 24)
  variables = {'params': params}
  np.testing.assert_allclose(
    _decode_layer(layer, variables, x), jax.jit(layer.apply)(variables, x), atol=2e-5, rtol=2e-5
  )


@pytest.mark.parametrize('mechanism', ['linear', 'softmax'])
def test_model_decode_matches_parallel_at_every_position(mechanism):
  n = 40
  model = CausalTransformer(
    TransformerConfig(
      max_length=n, d_model=16, depth=2, num_heads=2, mlp_dim=32, mechanism=mechanism
    )
  )
  pixels = jax.random.randint(jax.random.PRNGKey(0), (B, n), 0, 256)
  inputs = shift_right(pixels, model.start_token)
  params = jax.jit(model.init)(jax.random.PRNGKey(1), inputs)['params']
  # Larger weights than at init, so attention is far from uniform (float32
  # rounding then reaches ~1e-4 of logits ~10; in float64 the two agree exactly).
  params = jax.jit(lambda ps: jax.tree.map(lambda p: p * 3.0, ps))(params)  # one program
  helpers.assert_decode_matches_parallel(model, params, inputs)


def test_linear_decode_state_is_constant_size():
  model = CausalTransformer(
    TransformerConfig(
      max_length=L, d_model=16, depth=1, num_heads=2, mlp_dim=32, mechanism='linear'
    )
  )
  decoder = model.clone(decode=True)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, L), jnp.int32))
  short = jax.eval_shape(lambda p: sampling.init_cache(decoder, p, 1, 8), params['params'])
  long = jax.eval_shape(lambda p: sampling.init_cache(decoder, p, 1, L), params['params'])
  assert jax.tree.map(jnp.shape, short) == jax.tree.map(jnp.shape, long)


def test_model_decoding_past_max_length_stops_with_a_message():
  """A recurrent state has no capacity to run out of, so the learned positions table is what
  ends: a step past max_length must stop, not read a NaN position (jnp.take's fill)."""
  n = 3
  model = CausalTransformer(
    TransformerConfig(max_length=n, d_model=8, depth=1, num_heads=2, mlp_dim=16, mechanism='linear')
  )
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, n), jnp.int32))['params']
  step = jax.jit(sampling.make_step(model))
  cache = jax.jit(lambda p: sampling.init_cache(model.clone(decode=True), p, 1, n))(params)
  token = jnp.zeros((1,), jnp.int32)
  for _ in range(n):
    logits, cache = step(params, cache, token)
  assert np.all(np.isfinite(logits))
  with pytest.raises(Exception, match='position 3 is past max_length=3'):
    jax.block_until_ready(step(params, cache, token))


def test_decode_errors_name_valid_choices():
  x = jnp.zeros((1, 8, D))
  with pytest.raises(ValueError, match="'nystrom' has no causal form"):
    ea.MultiHeadAttention(num_heads=H, mechanism='nystrom', causal=True, decode=True).init(
      jax.random.PRNGKey(0), x
    )
  with pytest.raises(ValueError, match="'nystrom' has no decoding form"):
    ea.MultiHeadAttention(num_heads=H, mechanism='nystrom', decode=True).init(
      jax.random.PRNGKey(0), x
    )
  with pytest.raises(ValueError, match="'linformer' has no causal form"):
    ea.MultiHeadAttention(
      num_heads=H, mechanism='linformer', causal=True, max_length=8, decode=True
    ).init(jax.random.PRNGKey(0), x)
  assert {'softmax', 'linear', 'rfa', 'performer', 'local'} <= set(decoding.decodable_mechanisms())
  with pytest.raises(ValueError, match=r"'nystrom' has no decoding form.*softmax.*linear"):
    decl = ea.get_mechanism('nystrom')
    decoding.decode_form(decl, decl.resolve())
  layer = ea.MultiHeadAttention(num_heads=H, causal=True, decode=True)
  variables = jax.jit(layer.init)(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match='takes no mask.*segment_ids=0'):
    layer.apply(variables, x, mask=jnp.ones((1, 8), bool), mutable=['cache'])


def test_decoding_past_the_cache_capacity_stops_with_a_message():
  """The cache holds the first call's length: step 3 of a cache made from 3 tokens
  would otherwise overwrite the last slot silently."""
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 3, D))
  layer = ea.MultiHeadAttention(num_heads=H, causal=True, decode=True)
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  params, cache = {'params': variables['params']}, variables['cache']
  step = jax.jit(lambda c, xt: layer.apply({**params, 'cache': c}, xt, mutable=['cache']))
  token = x[:, :1]
  for _ in range(3):
    _, state = step(cache, token)
    cache = state['cache']
  assert cache['cached_key'].shape == (1, 3, H, D // H)  # flax's cache layout and names
  with pytest.raises(Exception, match='position 3 is past the cache capacity of 3'):
    jax.block_until_ready(step(cache, token))


WINDOW, N = 4, 13  # local attention over several windows: its ring buffer wraps three times


@pytest.mark.parametrize(
  'kw', [{}, {'rotary': True}, {'num_kv_heads': 1}], ids=['plain', 'rotary', 'gqa']
)
def test_local_attention_decodes_through_a_ring_buffer_of_its_window(kw):
  """Local attention (window 4) caches 4 slots, not the sequence: created by a 6-token call
  and stepped 13 times (past that call's length: the state is constant size), every step
  equals the parallel causal forward over the 13 tokens, and slot s holds the key and value
  of the last position p with p mod 4 = s (a key cached rotated at p where rotary applies;
  one key/value head for the two query heads with num_kv_heads=1)."""
  x = jax.random.normal(jax.random.PRNGKey(0), (B, N, D))
  layer = ea.MultiHeadAttention(
    num_heads=H, mechanism='local', causal=True, options={'window': WINDOW}, **kw
  )
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  parallel, qkv = jax.jit(lambda v, x: layer.apply(v, x, mutable=['attention_qkv']))(variables, x)
  dec = layer.clone(decode=True)
  cache = helpers.empty_cache(dec, variables, x[:, :6])
  kv_heads = kw.get('num_kv_heads', H)
  assert cache['cache']['cached_key'].shape == (B, WINDOW, kv_heads, D // H)
  step = jax.jit(lambda c, xt: dec.apply({**variables, **c}, xt, mutable=['cache']))
  outs = []
  for t in range(N):
    y, cache = step(cache, x[:, t : t + 1])
    outs.append(y)
  np.testing.assert_allclose(jnp.concatenate(outs, axis=1), parallel, atol=2e-5, rtol=2e-5)
  ((_, k, v),) = qkv['attention_qkv']['qkv']
  k, v = np.asarray(k), np.asarray(v)  # indexed in NumPy, not by eager gathers
  last = np.array([N - 1 - (N - 1 - s) % WINDOW for s in range(WINDOW)])  # [12, 9, 10, 11]
  keys = jax.jit(rotary.rotate)(k[:, last], last) if kw.get('rotary') else k[:, last]
  np.testing.assert_allclose(cache['cache']['cached_key'], keys, atol=1e-6)
  np.testing.assert_allclose(cache['cache']['cached_value'], v[:, last], atol=1e-6)


@pytest.mark.parametrize('projection', ['standard', 'super'])
def test_local_attention_keeps_the_capacity_limit_where_its_cache_cannot_wrap(projection):
  """'standard': a cache created by 3 tokens, shorter than the window of 4, has 3 slots; token
  3 would overwrite token 0, still in its window, so step 3 stops with the capacity message
  (as softmax's does). 'super': the ring buffer has no limit, but the super projection's raw
  values hold the creating call's 6 tokens, so step 6 stops with its own message."""
  length, message = {
    'standard': (3, 'position 3 is past the cache capacity of 3'),
    'super': (6, "position 6 is past the super projection's context of 6"),
  }[projection]
  x = jax.random.normal(jax.random.PRNGKey(0), (1, length, D))
  layer = ea.MultiHeadAttention(
    num_heads=H,
    mechanism='local',
    causal=True,
    decode=True,
    options={'window': WINDOW},
    projection=projection,
    max_length=8,
  )
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  params, cache = {'params': variables['params']}, variables['cache']
  assert cache['cached_key'].shape[1] == min(length, WINDOW)
  step = jax.jit(lambda c, xt: layer.apply({**params, 'cache': c}, xt, mutable=['cache']))
  for t in range(length):
    _, state = step(cache, x[:, t : t + 1])
    cache = state['cache']
  with pytest.raises(Exception, match=message):
    jax.block_until_ready(step(cache, x[:, :1]))


def test_decoding_from_the_cache_index_alone_with_two_batch_axes():
  """flax's rule: a layer built without causal=True decodes too, each step attending to the
  cached tokens up to its own, so the steps equal the causal forward; inputs with two batch
  axes [b1, b2, length, features] keep one cache for the flattened batch."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 10, D))
  layer = ea.MultiHeadAttention(num_heads=H)
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  causal = jax.jit(ea.MultiHeadAttention(num_heads=H, causal=True).apply)(variables, x)
  dec = layer.clone(decode=True)
  cache = helpers.empty_cache(dec, variables, x)
  assert cache['cache']['cached_key'].shape == (6, 10, H, D // H)
  step = jax.jit(lambda c, xt: dec.apply({**variables, **c}, xt, mutable=['cache']))
  outs = []
  for t in range(x.shape[2]):
    y, cache = step(cache, x[:, :, t : t + 1])
    outs.append(y)
  np.testing.assert_allclose(jnp.concatenate(outs, axis=2), causal, atol=2e-5, rtol=2e-5)
  with pytest.raises(ValueError, match='a decoding step takes no mask'):
    dec.apply(
      {**variables, **cache}, x[:, :, :1], mutable=['cache'], mask=jnp.ones((2, 3, 1), bool)
    )


@pytest.mark.parametrize('window', [None, 5])
def test_kv_cache_attention_groups_heads_over_any_cache_length(window):
  """One query per head over a grouped cache (4 query heads, 2 kv heads) of 70 slots (not a
  multiple of the block: the last block overlaps) equals a float64 NumPy softmax over the
  visible keys, with query head i reading kv head i // 2."""
  rng = np.random.default_rng(0)
  q, keys, values = (rng.standard_normal(s) for s in ((2, 4, 8), (2, 70, 2, 8), (2, 70, 2, 3)))
  attention = jax.jit(functools.partial(decoding.kv_cache_attention, window=window))
  for index in (0, 63, 64, 69):  # query_times an array: one compiled program for all four
    out = attention(
      jnp.float32(q[:, None]),
      jnp.float32(keys),
      jnp.float32(values),
      query_times=jnp.asarray([index]),
    )[:, 0]
    lo = 0 if window is None else max(0, index - window + 1)
    k, v = (
      np.repeat(keys[:, lo : index + 1], 2, axis=2),
      np.repeat(values[:, lo : index + 1], 2, axis=2),
    )
    s = np.einsum('bhd,bkhd->bhk', q, k) / np.sqrt(8)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(
      out, np.einsum('bhk,bkhd->bhd', w, v), atol=1e-5, err_msg=f'index {index}'
    )


@pytest.mark.parametrize('mechanism', ['softmax', 'linear'])  # a key/value cache, a state
def test_a_decoding_step_of_another_batch_than_the_cache_names_both(mechanism):
  """A cache made for batch 2 refuses steps of batch 3 and 1 in one line, in the Linen and
  the NNX layer (they were shape errors from deep inside the step, or a broadcast)."""
  from flax import nnx

  from efficient_attn import nnx as ea_nnx

  x = jnp.zeros((2, 4, D))
  linen = ea.MultiHeadAttention(num_heads=H, mechanism=mechanism, causal=True, decode=True)
  variables = jax.jit(linen.init)(jax.random.PRNGKey(0), x)
  nnx_layer = nnx.jit(  # built by one compiled program; the refused steps below run eagerly
    lambda: ea_nnx.MultiHeadAttention(
      num_heads=H, in_features=D, mechanism=mechanism, causal=True, rngs=nnx.Rngs(0)
    )
  )()
  nnx_layer.init_cache(x.shape)
  for batch in (3, 1):
    token = jnp.zeros((batch, 1, D))
    message = f'decoding step of batch {batch} does not fit the cache, made for batch 2'
    with pytest.raises(ValueError, match=message):
      linen.apply(variables, token, mutable=['cache'])
    with pytest.raises(ValueError, match=message):
      nnx_layer(token, decode=True)

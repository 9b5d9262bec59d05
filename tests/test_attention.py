"""Properties every mechanism and projection scheme must have, through the public API."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry

B, L, D, H = 2, 16, 32, 4

# Small options so every mechanism is cheap and non-trivial at length 16.
OPTIONS = {
    'softmax': {}, 'softmax_chunked': {'q_chunk': 8, 'k_chunk': 4}, 'linear': {},
    'rfa': {'num_features': 16}, 'performer': {'num_features': 16},
    'linformer': {'k_proj': 8}, 'nystrom': {'num_landmarks': 4}, 'local': {'window': 4},
}
CAUSAL = [n for n, s in registry.MECHANISMS.items() if s.supports_causal]


def _layer(mechanism, projection='standard', causal=False, **kw):
  return ea.MultiHeadAttention(num_heads=H, mechanism=mechanism, projection=projection,
                               options=OPTIONS[mechanism], causal=causal, max_length=L, **kw)


def _inputs(seed=0, scale=1.0, dtype=jnp.float32):
  return (scale * jax.random.normal(jax.random.PRNGKey(seed), (B, L, D))).astype(dtype)


def test_names_listed():
  assert set(ea.list_mechanisms()) == set(OPTIONS)
  assert ea.list_projections() == ('standard', 'optimised', 'efficient', 'super')
  for name in ea.list_mechanisms():
    spec = ea.get_mechanism(name)
    assert issubclass(spec.module, nn.Module) and callable(spec.fn)


def test_unknown_names_list_valid_ones():
  with pytest.raises(ValueError, match="'nope'.*softmax.*nystrom"):
    ea.get_mechanism('nope')
  x = _inputs()
  with pytest.raises(ValueError, match="'bogus'.*standard.*super"):
    ea.MultiHeadAttention(num_heads=H, projection='bogus').init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="unknown option.*'landmarks'.*num_landmarks"):
    ea.MultiHeadAttention(num_heads=H, mechanism='nystrom',
                          options={'landmarks': 3}).init(jax.random.PRNGKey(0), x)


def test_bad_combinations_say_why():
  x = _inputs()
  with pytest.raises(ValueError, match="'nystrom' has no causal form"):
    _layer('nystrom', causal=True).init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match='num_heads=3 must divide'):
    ea.MultiHeadAttention(num_heads=3).init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="dropout_rate=0.1: .*softmax.*not 'linear'"):
    ea.MultiHeadAttention(num_heads=H, mechanism='linear', dropout_rate=0.1).init(
        jax.random.PRNGKey(0), x, deterministic=False)
  with pytest.raises(ValueError, match="'super' needs max_length"):
    ea.MultiHeadAttention(num_heads=H, projection='super').init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match='exceeds max_length=8'):
    ea.MultiHeadAttention(num_heads=H, projection='super', max_length=8).init(
        jax.random.PRNGKey(0), x)


def test_standard_softmax_equals_flax():
  x = _inputs()
  kv = _inputs(1)
  mask = nn.make_attention_mask(jnp.ones((B, L), bool), jnp.arange(L)[None, :] < jnp.array([[L], [L - 5]]))
  ours = ea.MultiHeadAttention(num_heads=H)
  ref = nn.MultiHeadDotProductAttention(num_heads=H)
  params = ours.init(jax.random.PRNGKey(0), x, kv)['params']
  ref_params = ref.init(jax.random.PRNGKey(0), x, kv)['params']
  assert jax.tree.structure(params) == jax.tree.structure(ref_params)
  for m in (None, mask):
    a = ours.apply({'params': params}, x, kv, mask=m)
    b = ref.apply({'params': params}, x, kv, mask=m)
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('d,h,l', [(128, 4, 64), (32, 4, 16), (64, 8, 10)])
def test_parameter_counts_match_paper(d, h, l):
  x = jnp.zeros((1, l, d))
  expected = {'standard': 4 * (d * d + d), 'optimised': 3 * (d * d + d),
              'efficient': 2 * (d * d + d), 'super': 2 * (d * d + d) + l * l + l}
  for projection, count in expected.items():
    layer = ea.MultiHeadAttention(num_heads=h, projection=projection, max_length=l)
    params = jax.eval_shape(layer.init, jax.random.PRNGKey(0), x)['params']
    assert sum(p.size for p in jax.tree.leaves(params)) == count, projection


@pytest.mark.parametrize('projection', ea.list_projections())
def test_every_projection_runs_with_every_mechanism(projection):
  x = _inputs()
  for name in ea.list_mechanisms():
    layer = _layer(name, projection)
    variables = layer.init(jax.random.PRNGKey(0), x)
    y = layer.apply(variables, x)
    assert y.shape == x.shape and bool(jnp.all(jnp.isfinite(y))), name


@pytest.mark.parametrize('mechanism', CAUSAL)
@pytest.mark.parametrize('projection', ['standard', 'super'])
def test_no_look_ahead(mechanism, projection):
  x = _inputs()
  layer = _layer(mechanism, projection, causal=True)
  variables = layer.init(jax.random.PRNGKey(0), x)
  if projection == 'super':  # a random W_A, so a dense kernel would leak the future
    p = variables['params']['alignment']['kernel']
    variables['params']['alignment']['kernel'] = jax.random.normal(jax.random.PRNGKey(3), p.shape)
  jac = jax.jacrev(lambda z: layer.apply(variables, z)[0])(x)  # [L, D, B, L, D]
  dep = jnp.abs(jac[:, :, 0]).sum(axis=(1, 3))  # [t_out, t_in]
  future = jnp.triu(jnp.ones((L, L), bool), k=1)
  assert float(jnp.max(jnp.where(future, dep, 0.0))) == 0.0
  assert float(jnp.min(jnp.where(jnp.eye(L, dtype=bool), dep, 1.0))) > 0.0


@pytest.mark.parametrize('mechanism', list(OPTIONS))
def test_padded_keys_get_zero_weight(mechanism):
  x = _inputs()
  valid = jnp.arange(L)[None, :] < jnp.array([[L], [L - 6]])
  mask = nn.make_attention_mask(valid, valid)
  layer = _layer(mechanism)
  variables = layer.init(jax.random.PRNGKey(0), x)
  noise = jax.random.normal(jax.random.PRNGKey(9), x.shape) * 10.0
  x2 = jnp.where(valid[..., None], x, noise)  # change only padded tokens
  kv_only = lambda z: layer.apply(variables, x, z, mask=mask)
  y1, y2 = kv_only(x), kv_only(x2)
  np.testing.assert_allclose(np.where(valid[..., None], y1, 0), np.where(valid[..., None], y2, 0),
                             atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize('mechanism', list(OPTIONS))
def test_bfloat16_and_large_inputs_are_finite(mechanism):
  for dtype, scale in ((jnp.bfloat16, 1.0), (jnp.float32, 100.0), (jnp.bfloat16, 30.0)):
    x = _inputs(scale=scale, dtype=dtype)
    layer = _layer(mechanism, dtype=dtype, param_dtype=jnp.float32)
    variables = layer.init(jax.random.PRNGKey(0), x)
    y = layer.apply(variables, x)
    assert y.dtype == dtype
    assert bool(jnp.all(jnp.isfinite(y.astype(jnp.float32)))), (mechanism, dtype, scale)
    g = jax.grad(lambda v: layer.apply(v, x).astype(jnp.float32).sum())(variables)
    assert all(bool(jnp.all(jnp.isfinite(t))) for t in jax.tree.leaves(g)), (mechanism, dtype)


def test_attention_fn_drop_in():
  x = _inputs()
  base = nn.MultiHeadDotProductAttention(num_heads=H)
  params = base.init(jax.random.PRNGKey(0), x)['params']
  for name in ('softmax', 'softmax_chunked', 'local'):
    fn = ea.make_attention_fn(name, **({'window': 4 * L} if name == 'local' else {}))
    swapped = nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=fn)
    np.testing.assert_allclose(swapped.apply({'params': params}, x),
                               base.apply({'params': params}, x), atol=1e-5, rtol=1e-5)
  linear = nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=ea.make_attention_fn('linear'))
  ours = ea.MultiHeadAttention(num_heads=H, mechanism='linear')
  np.testing.assert_allclose(linear.apply({'params': params}, x),
                             ours.apply({'params': params}, x), atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match='cannot be an attention_fn'):
    ea.make_attention_fn('nystrom')


def test_super_starts_as_efficient_and_sows_qkv():
  x = _inputs()
  sup = ea.MultiHeadAttention(num_heads=H, projection='super', max_length=L)
  eff = ea.MultiHeadAttention(num_heads=H, projection='efficient')
  variables = sup.init(jax.random.PRNGKey(0), x)
  params = dict(variables['params'])
  params.pop('alignment')
  np.testing.assert_allclose(sup.apply(variables, x), eff.apply({'params': params}, x), atol=1e-6)
  _, state = eff.apply({'params': params}, x, mutable=['intermediates'])
  q, k, v = state['intermediates']['qkv'][0]
  assert q.shape == k.shape == v.shape == (B, L, H, D // H)
  np.testing.assert_allclose(v, x.reshape(B, L, H, D // H))  # efficient: V sliced, no W_V


@pytest.mark.parametrize('mechanism', list(OPTIONS))
def test_bfloat16_parameters(mechanism):
  x = _inputs(dtype=jnp.bfloat16)
  layer = _layer(mechanism, 'super', dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  variables = layer.init(jax.random.PRNGKey(0), x)
  assert {p.dtype for p in jax.tree.leaves(variables['params'])} == {jnp.dtype(jnp.bfloat16)}
  y = layer.apply(variables, x)
  assert y.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))

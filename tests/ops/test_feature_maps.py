"""Tests of efficient_attn.ops.feature_maps (tiny shapes, CPU, a few seconds)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.ops import feature_maps as fm


def test_deterministic_maps_values():
  x = jnp.array([-2.0, -0.5, 0.0, 0.5, 3.0])
  np.testing.assert_allclose(fm.elu_plus_one(x), np.where(x > 0, x + 1, np.exp(x)), rtol=1e-6)
  np.testing.assert_allclose(fm.relu(x), np.maximum(x, 0))
  np.testing.assert_allclose(fm.identity(x), x)
  for f in (fm.elu_plus_one, fm.relu, fm.identity):
    assert f(x.astype(jnp.bfloat16)).dtype == jnp.float32


def test_taylor_features_give_the_second_order_expansion_of_exp():
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(2, 3, 5))
  phi_q, phi_k = fm.taylor(jnp.asarray(q)), fm.taylor(jnp.asarray(k))
  assert phi_q.shape == (3, 1 + 5 + 25) == (3, fm.feature_dim('taylor', 5))
  s = np.sum(q * k, axis=-1) / math.sqrt(5)
  np.testing.assert_allclose(
    np.sum(np.asarray(phi_q, np.float64) * np.asarray(phi_k), -1), 1 + s + s * s / 2, rtol=1e-5
  )
  assert fm.taylor(jnp.asarray(q, jnp.bfloat16)).dtype == jnp.float32
  assert [fm.feature_dim(n, 5) for n in ('elu', 'relu', 'identity')] == [5, 5, 5]
  with pytest.raises(ValueError, match='valid feature maps: elu, relu, identity, taylor'):
    fm.feature_dim('cosine', 5)


def test_get_feature_map():
  assert fm.get_feature_map('elu') is fm.elu_plus_one
  assert fm.get_feature_map('relu') is fm.relu
  assert fm.get_feature_map('identity') is fm.identity
  with pytest.raises(ValueError, match="elu, relu, identity"):
    fm.get_feature_map('softmax')


@pytest.mark.parametrize('num_features,dim', [(16, 4), (10, 4), (3, 5)])
def test_orthogonal_projection_blocks(num_features, dim):
  w = np.asarray(fm.gaussian_projection(jax.random.PRNGKey(1), num_features, dim))
  assert w.shape == (num_features, dim)
  assert np.all(np.isfinite(w))
  for start in range(0, num_features, dim):
    block = w[start : start + dim]
    gram = block @ block.T
    off = gram - np.diag(np.diag(gram))
    assert np.max(np.abs(off)) < 1e-4 * np.max(np.diag(gram))
  # Not orthogonal across blocks (independent draws).
  if num_features >= 2 * dim:
    assert np.max(np.abs(w[:dim] @ w[dim : 2 * dim].T)) > 1e-2


def test_projection_row_norms_are_chi():
  dim = 4
  w = np.asarray(fm.gaussian_projection(jax.random.PRNGKey(2), 4096, dim))
  sq = np.sum(w * w, axis=1)
  # chi^2_dim: mean dim, variance 2 dim.
  assert abs(sq.mean() - dim) < 0.3
  assert abs(sq.var() - 2 * dim) < 1.5
  iid = np.asarray(fm.gaussian_projection(jax.random.PRNGKey(2), 4096, dim, orthogonal=False))
  assert abs(np.sum(iid * iid, axis=1).mean() - dim) < 0.3
  gram = iid[:dim] @ iid[:dim].T
  assert np.max(np.abs(gram - np.diag(np.diag(gram)))) > 1e-2


def test_trig_features_estimate_gaussian_kernel(x64):
  d, m = 3, 20000
  w = fm.gaussian_projection(jax.random.PRNGKey(3), m, d, dtype=jnp.float64)
  x = jnp.array([[0.3, -0.2, 0.5], [0.1, 0.4, -0.3]], jnp.float64)
  phi = fm.trig_features(x, w)
  assert phi.shape == (2, 2 * m)
  est = float(phi[0] @ phi[1])
  exact = math.exp(-0.5 * float(jnp.sum((x[0] - x[1]) ** 2)))
  assert abs(est - exact) < 0.02
  # Self-similarity is exactly 1 (sin^2 + cos^2).
  np.testing.assert_allclose(float(phi[0] @ phi[0]), 1.0, rtol=1e-12)


def test_positive_features_estimate_exp_kernel(x64):
  d, m = 3, 20000
  w = fm.gaussian_projection(jax.random.PRNGKey(4), m, d, dtype=jnp.float64)
  x = jnp.array([[0.3, -0.2, 0.5]], jnp.float64)
  y = jnp.array([[0.1, 0.4, -0.3]], jnp.float64)
  phi_x = fm.positive_features(x, w, is_query=True, stabilizer=0.0)
  phi_y = fm.positive_features(y, w, is_query=True, stabilizer=0.0)
  est = float(phi_x[0] @ phi_y[0])
  exact = math.exp(float(x[0] @ y[0]))
  assert abs(est - exact) / exact < 0.03
  assert bool(jnp.all(phi_x >= 0))


def test_positive_features_stabilisers():
  w = fm.gaussian_projection(jax.random.PRNGKey(5), 8, 4)
  x = jnp.asarray(np.random.default_rng(6).normal(size=(2, 5, 3, 4)), jnp.float32)
  pad = jnp.array([[True] * 5, [True, True, False, False, False]])
  keys = jax.jit(functools.partial(fm.positive_features, is_query=False, return_stabilizer=True))
  phi_q = jax.jit(functools.partial(fm.positive_features, is_query=True))(x, w)
  np.testing.assert_allclose(jnp.max(phi_q, axis=-1), 1 / math.sqrt(8), rtol=1e-6)
  phi_k, stab = keys(x, w, key_padding=pad)
  assert stab.shape == (2, 1, 3, 1)
  np.testing.assert_allclose(jnp.max(phi_k, axis=(1, 3)), 1 / math.sqrt(8), rtol=1e-6)
  assert bool(jnp.all(phi_k[1, 2:] == 0))
  # Padded keys are left out of the stabiliser: changing them changes nothing.
  phi_k2, _ = keys(x.at[1, 2:].set(50.0), w, key_padding=pad)
  np.testing.assert_array_equal(phi_k, phi_k2)
  # All keys padded: zero features, finite.
  none, _ = keys(x, w, key_padding=jnp.zeros((2, 5), bool))
  assert bool(jnp.all(none == 0))


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_positive_features_never_inf_or_nan(dtype):
  w = fm.gaussian_projection(jax.random.PRNGKey(7), 16, 4)

  @jax.jit
  def features_and_grads(x):
    outs = []
    for is_query in (True, False):
      f = lambda x: fm.positive_features(x, w, is_query=is_query)
      outs.append((f(x), jax.grad(lambda x: jnp.sum(f(x)))(x)))
    return outs

  base = np.random.default_rng(8).normal(size=(2, 6, 2, 4))
  for scale in (1.0, 100.0, 1e4):
    for phi, g in features_and_grads(jnp.asarray(base * scale, dtype)):
      assert phi.dtype == jnp.float32
      assert bool(jnp.all(jnp.isfinite(phi))) and bool(jnp.all(phi >= 0))
      assert bool(jnp.all(phi <= 1 / math.sqrt(16) + 1e-6))
      assert bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))


def test_fixed_feature_rng():
  a = fm.fixed_feature_rng(0, ('encoder', 'layer_0', 'mechanism'))
  b = fm.fixed_feature_rng(0, ('encoder', 'layer_0', 'mechanism'))
  c = fm.fixed_feature_rng(0, ('encoder', 'layer_1', 'mechanism'))
  d = fm.fixed_feature_rng(1, ('encoder', 'layer_0', 'mechanism'))
  np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(b))
  assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(c))
  assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(d))

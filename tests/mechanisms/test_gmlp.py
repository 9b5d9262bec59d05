"""Tests of efficient_attn.mechanisms.gmlp against a float64 NumPy reference."""

from helpers import value_and_grads
import jax
import jax.numpy as jnp
import numpy as np
from pattern_reference import flax_mask
from pattern_reference import inputs
from pattern_reference import padding
from pattern_reference import with_noise_at_padding
import pytest

from efficient_attn.mechanisms import gmlp

spatial_gating = jax.jit(gmlp.spatial_gating, static_argnames=('causal',))


def np_spatial_gating(q, v, w, bias, key_padding=None, causal=False):
  """q * (W LayerNorm(v) + b), the norm over heads x v_dim, float64."""
  q, v, w, bias = (np.asarray(x, np.float64) for x in (q, v, w, bias))
  b, n, h, dv = v.shape
  x = v.reshape(b, n, h * dv)
  x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + gmlp.LAYER_NORM_EPSILON)
  if key_padding is not None:
    x = x * np.asarray(key_padding)[:, :, None]
  w = w[:n, :n]
  if causal:
    w = np.tril(w)
  mixed = np.einsum('ij,bjc->bic', w, x) + bias[:n, None]
  return q * mixed.reshape(b, n, h, dv)


def _weights(seed=3, length=12):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(length, length)), 1 + 0.1 * rng.normal(size=(length,))


@pytest.mark.parametrize('causal', [False, True])
def test_matches_numpy_reference(x64, causal):
  """Under jax.jit: no mask, key padding, a flax-style mask; n = 10 < max_length = 12."""
  q, k, v = inputs(n=10, dv=4)
  w, bias = _weights()
  pad = padding(10)
  for mask, key_padding in ((None, None), (pad, pad), (flax_mask(pad), pad)):
    got = spatial_gating(q, k, v, w, bias, mask, causal=causal)
    assert got.dtype == jnp.float64 and got.shape == v.shape
    np.testing.assert_allclose(
      np.asarray(got), np_spatial_gating(q, v, w, bias, key_padding, causal), rtol=1e-10, atol=1e-10
    )


def test_gradients_match_numpy_reference(x64):
  """d sum(out) / d q and / d W against central differences of the float64 reference."""
  q, k, v = inputs(n=6, dv=4)
  w, bias = _weights(length=6)
  _, (gq,) = value_and_grads(lambda q: spatial_gating(q, k, v, w, bias), 1)(q)
  np.testing.assert_allclose(
    np.asarray(gq), np_spatial_gating(np.ones_like(q), v, w, bias), rtol=1e-10, atol=1e-10
  )
  gw = jax.grad(lambda w: jnp.sum(spatial_gating(q, k, v, w, bias)))(jnp.asarray(w))
  eps, num = 1e-6, np.zeros_like(w)
  for i, j in np.ndindex(*w.shape):
    dw = np.zeros_like(w)
    dw[i, j] = eps
    num[i, j] = (
      np_spatial_gating(q, v, w + dw, bias).sum() - np_spatial_gating(q, v, w - dw, bias).sum()
    ) / (2 * eps)
  np.testing.assert_allclose(np.asarray(gw), num, rtol=1e-6, atol=1e-8)


def test_padded_tokens_move_no_output_and_causal_has_no_look_ahead():
  q, k, v = inputs(n=10, dv=4, dtype=np.float32)
  w, bias = (x.astype(np.float32) for x in _weights(length=10))
  pad = padding(10)
  vg = value_and_grads(lambda q, k, v: spatial_gating(q, k, v, w, bias, pad))
  out, (_, gk, gv) = vg(q, k, v)
  out2, _ = vg(with_noise_at_padding(q, pad), k, with_noise_at_padding(v, pad))
  np.testing.assert_allclose(np.asarray(out2)[pad], np.asarray(out)[pad], rtol=1e-6)
  assert np.all(np.asarray(gv)[~pad] == 0) and np.any(np.asarray(gv)[pad] != 0)
  assert np.all(np.asarray(gk) == 0)  # k is unused
  changed = v.copy()
  changed[:, 7:] += 5.0 * np.random.default_rng(2).normal(size=changed[:, 7:].shape)
  before, after = (spatial_gating(q, k, x, w, bias, causal=True) for x in (v, changed))
  np.testing.assert_array_equal(np.asarray(after)[:, :7], np.asarray(before)[:, :7])
  assert not np.allclose(np.asarray(after)[:, 7:], np.asarray(before)[:, 7:])


def test_initialisation_is_the_identity_gate():
  """W near zero and b = 1 (the paper): the unit starts as out ~= q."""
  w = gmlp.spatial_kernel_init(jax.random.PRNGKey(0), (12, 12))
  assert float(jnp.abs(w).max()) <= 1e-3 / 12
  q, k, v = inputs(n=12, dv=4, dtype=np.float32)
  out = spatial_gating(q, k, v, w, jnp.ones(12))
  np.testing.assert_allclose(np.asarray(out), q, atol=1e-3)


def test_bad_shapes_raise_one_line_errors():
  q, k, v = inputs(n=10, dv=3)
  w, bias = _weights()
  with pytest.raises(ValueError, match=r'same head_dim: got q \(2, 10, 2, 4\), v \(2, 10, 2, 3\)'):
    gmlp.spatial_gating(q, k, v, w, bias)
  q, k, v = inputs(n=13, dv=4)
  with pytest.raises(ValueError, match='input length 13 exceeds max_length 12'):
    gmlp.spatial_gating(q, k, v, w, bias)
  with pytest.raises(ValueError, match=r'spatial_kernel \[max_length, max_length\]'):
    gmlp.spatial_gating(q, k, v, w[:, :5], bias)

"""Tests of efficient_attn.mechanisms.mixer against a float64 NumPy reference."""

from helpers import value_and_grads
import jax
import jax.numpy as jnp
import numpy as np
from pattern_reference import flax_mask
from pattern_reference import inputs
from pattern_reference import padding
from pattern_reference import with_noise_at_padding
import pytest

from efficient_attn.mechanisms import mixer

token_mixing = jax.jit(mixer.token_mixing, static_argnames=('causal',))


def np_gelu(x):
  """The tanh approximation of GELU (flax's default, the official Mixer code's)."""
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def np_token_mixing(v, w1, b1, w2, b2, key_padding=None):
  """out[:, :, c] = W2^T GELU(W1^T v[:, :, c] + b1) + b2 per channel c, float64."""
  v, w1, b1, w2, b2 = (np.asarray(x, np.float64) for x in (v, w1, b1, w2, b2))
  n = v.shape[1]
  if key_padding is not None:
    v = v * np.asarray(key_padding)[:, :, None, None]
  out = np.zeros_like(v)
  for bi, hi, c in np.ndindex(v.shape[0], v.shape[2], v.shape[3]):
    hidden = np_gelu(w1[:n].T @ v[bi, :, hi, c] + b1)
    out[bi, :, hi, c] = w2[:, :n].T @ hidden + b2[:n]
  return out


def _weights(seed=3, length=12, hidden=5):
  rng = np.random.default_rng(seed)
  return (
    rng.normal(size=(length, hidden)),
    rng.normal(size=(hidden,)),
    rng.normal(size=(hidden, length)),
    rng.normal(size=(length,)),
  )


def test_matches_numpy_reference(x64):
  """Under jax.jit: no mask, key padding, a flax-style mask; n = 10 < max_length = 12."""
  q, k, v = inputs(n=10)
  weights = _weights()
  pad = padding(10)
  for mask, key_padding in ((None, None), (pad, pad), (flax_mask(pad), pad)):
    got = token_mixing(q, k, v, *weights, mask)
    assert got.dtype == jnp.float64 and got.shape == v.shape
    np.testing.assert_allclose(
      np.asarray(got), np_token_mixing(v, *weights, key_padding), rtol=1e-10, atol=1e-10
    )


def test_gradients_match_numpy_reference(x64):
  """d sum(out) / d v and / d W1 against central differences of the float64 reference."""
  q, k, v = inputs(n=6, h=1, dv=2)
  w1, b1, w2, b2 = _weights(length=6, hidden=3)
  gv = jax.grad(lambda v: jnp.sum(token_mixing(q, k, v, w1, b1, w2, b2)))(jnp.asarray(v))
  gw = jax.grad(lambda w: jnp.sum(token_mixing(q, k, v, w, b1, w2, b2)))(jnp.asarray(w1))
  eps = 1e-6
  for got, x, at in (
    (gv, v, lambda d: np_token_mixing(v + d, w1, b1, w2, b2)),
    (gw, w1, lambda d: np_token_mixing(v, w1 + d, b1, w2, b2)),
  ):
    num = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
      d = np.zeros_like(x)
      d[idx] = eps
      num[idx] = (at(d).sum() - at(-d).sum()) / (2 * eps)
    np.testing.assert_allclose(np.asarray(got), num, rtol=1e-6, atol=1e-8)


def test_padded_values_move_no_output_and_shorter_input_is_zero_padding(x64):
  q, k, v = inputs(n=10)
  weights = _weights()
  pad = padding(10)
  vg = value_and_grads(lambda q, k, v: token_mixing(q, k, v, *weights, pad))
  out, (gq, gk, gv) = vg(q, k, v)
  out2, _ = vg(q, k, with_noise_at_padding(v, pad))
  np.testing.assert_allclose(np.asarray(out2), np.asarray(out), rtol=1e-12, atol=1e-12)
  assert np.all(np.asarray(gv)[~pad] == 0) and np.any(np.asarray(gv)[pad] != 0)
  assert np.all(np.asarray(gq) == 0) and np.all(np.asarray(gk) == 0)  # q, k are unused
  zpad = lambda x: np.pad(x, ((0, 0), (0, 2), (0, 0), (0, 0)))
  full = token_mixing(zpad(q), zpad(k), zpad(v), *weights)
  np.testing.assert_allclose(
    np.asarray(token_mixing(q, k, v, *weights)), np.asarray(full)[:, :10], rtol=1e-12, atol=1e-12
  )


def test_refusals_are_one_line():
  q, k, v = inputs(n=13)
  weights = _weights()
  with pytest.raises(ValueError, match='input length 13 exceeds max_length 12'):
    mixer.token_mixing(q, k, v, *weights)
  with pytest.raises(ValueError, match='no causal form'):
    mixer.token_mixing(q, k, v, *weights, causal=True)
  w1, b1, w2, b2 = weights
  with pytest.raises(ValueError, match=r'w1 \[max_length, hidden\]'):
    mixer.token_mixing(q[:, :10], k[:, :10], v[:, :10], w1, b1, w2[:, :5], b2)

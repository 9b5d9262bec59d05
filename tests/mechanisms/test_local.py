"""Tests of efficient_attn.mechanisms.local against a dense float64 NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pattern_reference
import pytest

import efficient_attn as ea
from efficient_attn.mechanisms import local

# Jitted once per shape: much faster on CPU than op-by-op dispatch.
local_attention = jax.jit(
  local.local_attention, static_argnames=('window', 'causal', 'scale', 'block_size')
)


def np_band(n, window, causal):
  i, j = np.arange(n)[:, None], np.arange(n)[None, :]
  if causal:
    return (j <= i) & (j > i - window)
  return np.abs(i - j) <= window // 2


def np_local(q, k, v, window, causal=False, key_padding=None, scale=None):
  """Dense banded softmax in float64; rows with no allowed key give 0."""
  n = np.shape(q)[1]
  return pattern_reference.np_masked_attention(
    q, k, v, np_band(n, window, causal)[None, None], key_padding, scale
  )


def _qkv(rng, b=2, n=11, h=2, d=4, dv=3, dtype=np.float64):
  return (
    rng.normal(size=(b, n, h, d)).astype(dtype),
    rng.normal(size=(b, n, h, d)).astype(dtype),
    rng.normal(size=(b, n, h, dv)).astype(dtype),
  )


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize(
  'window, block_size', [(1, None), (4, None), (5, None), (6, 4), (3, 1), (7, 16)]
)
def test_matches_dense_reference(x64, causal, window, block_size):
  rng = np.random.default_rng(0)
  q, k, v = _qkv(rng, n=11)  # 11 is not a multiple of any block size used
  pad = np.ones((2, 11), bool)
  pad[1, 8:] = False
  pad[0, 4] = False
  for mask in (None, pad):
    got = local_attention(
      q, k, v, window=window, mask=mask, causal=causal, scale=0.8, block_size=block_size
    )
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(
      np.asarray(got), np_local(q, k, v, window, causal, mask, scale=0.8), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize('causal', [False, True])
def test_large_window_equals_exact_softmax(x64, causal):
  rng = np.random.default_rng(1)
  q, k, v = _qkv(rng, n=9)
  got = local_attention(q, k, v, window=18, causal=causal)
  full = np.tril(np.ones((9, 9), bool)) if causal else np.ones((9, 9), bool)
  s = np.einsum('bqhd,bkhd->bhqk', q, k) / 2.0
  s = np.where(full, s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  ref = np.einsum('bhqk,bkhd->bqhd', w / w.sum(-1, keepdims=True), v)
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-12)


def test_causal_no_look_ahead():
  rng = np.random.default_rng(2)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, b=1, n=10))
  t = 4

  def out_at_t(q, k, v):
    return jnp.sum(local.local_attention(q, k, v, window=3, causal=True, block_size=2)[:, t])

  grads = jax.jit(jax.grad(out_at_t, argnums=(0, 1, 2)))(q, k, v)
  for g in grads:
    g = np.asarray(g)
    assert np.all(g[:, t + 1 :] == 0)
  gq, gk, gv = (np.asarray(g) for g in grads)
  assert np.any(gq[:, t] != 0)
  # Window 3: keys t-2, t-1, t carry gradient; older keys do not.
  assert np.all(np.any(gv[:, t - 2 : t + 1] != 0, axis=(0, 2, 3)))
  assert np.all(gv[:, : t - 2] == 0) and np.all(gk[:, : t - 2] == 0)


def test_padded_keys_do_not_matter():
  rng = np.random.default_rng(3)
  q, k, v = _qkv(rng, n=12, dtype=np.float32)
  pad = np.ones((2, 12), bool)
  pad[0, 9:] = False
  pad[1, 2:5] = False
  k2, v2 = k.copy(), v.copy()
  k2[~pad] = 1e3 * rng.normal(size=k2[~pad].shape)
  v2[~pad] = 1e3 * rng.normal(size=v2[~pad].shape)
  for causal in (False, True):
    out1 = local_attention(q, k, v, window=4, mask=pad, causal=causal)
    out2 = local_attention(q, k2, v2, window=4, mask=pad, causal=causal)
    np.testing.assert_allclose(np.asarray(out1), np.asarray(out2), rtol=1e-6, atol=1e-6)
    # A flax-style [b, h, q, k] mask is reduced to the same key padding.
    out3 = local_attention(
      q, k2, v2, window=4, causal=causal, mask=pad[:, None, :, None] & pad[:, None, None, :]
    )
    np.testing.assert_allclose(np.asarray(out1), np.asarray(out3), rtol=1e-6, atol=1e-6)


def test_query_with_no_visible_key_gives_zero():
  q = k = v = jnp.ones((1, 6, 1, 2))
  pad = jnp.array([[True, True, False, False, False, False]])
  out = local_attention(q, k, v, window=2, mask=pad, causal=True)
  np.testing.assert_array_equal(np.asarray(out[0, 3:]), 0.0)  # keys 2..5 all padded
  assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize('case', ['bf16', 'large_norm'])
@pytest.mark.parametrize('causal', [False, True])
def test_finite_outputs_and_grads(case, causal):
  rng = np.random.default_rng(4)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, n=10))
  if case == 'bf16':
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  else:
    q, k = 100 * q, 100 * k
  pad = np.ones((2, 10), bool)
  pad[1, 7:] = False

  def fn(q, k, v):
    return local.local_attention(q, k, v, window=4, mask=pad, causal=causal)

  def value_and_vjp(q, k, v):  # the backward in the same compiled program
    out, vjp = jax.vjp(fn, q, k, v)
    return out, vjp(jnp.ones_like(out))

  out, grads = jax.jit(value_and_vjp)(q, k, v)
  assert out.dtype == v.dtype
  assert np.all(np.isfinite(np.asarray(out).astype(np.float32)))
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g).astype(np.float32)))


def test_errors():
  q = k = v = jnp.zeros((1, 6, 1, 2))
  with pytest.raises(ValueError, match='window'):
    local.local_attention(q, k, v, window=0)
  with pytest.raises(ValueError, match='q_length == kv_length'):
    local.local_attention(q[:, :3], k, v, window=2)


def test_module_init_apply():
  rng = np.random.default_rng(5)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, n=9))
  for causal in (False, True):
    mod = ea.mechanism_module('local', causal=causal, options={'window': 4})
    variables = jax.jit(mod.init)(jax.random.PRNGKey(0), q, k, v)
    assert not variables.get('params')
    out = jax.jit(mod.apply)(variables, q, k, v)
    assert out.shape == (2, 9, 2, 3) and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np_local(q, k, v, 4, causal), atol=1e-5)
  out = jax.jit(ea.mechanism_module('local', options={'window': 4}, dtype=jnp.bfloat16).apply)(
    {}, q, k, v
  )
  assert out.dtype == jnp.bfloat16

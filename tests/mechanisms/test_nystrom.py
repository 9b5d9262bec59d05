"""Tests of efficient_attn.mechanisms.nystrom against a float64 NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn.mechanisms import nystrom
from efficient_attn.mechanisms.nystrom import depthwise_conv_skip

# Jitted once per shape: much faster on CPU than op-by-op dispatch.
nystrom_attention = jax.jit(
  nystrom.nystrom_attention, static_argnames=('num_landmarks', 'pinv_iterations', 'scale')
)
iterative_pinv = jax.jit(nystrom.iterative_pinv, static_argnames=('iterations',))


def _np_softmax(s, valid=None):
  if valid is None:
    valid = np.ones(s.shape, bool)
  s = np.where(valid, s, -np.inf)
  mx = s.max(-1, keepdims=True)
  mx = np.where(np.isfinite(mx), mx, 0.0)
  e = np.where(valid, np.exp(s - mx), 0.0)
  z = e.sum(-1, keepdims=True)
  return e / np.where(z == 0, 1.0, z)


def np_pinv_iter(a, iterations):
  """The paper's iteration, Z_0 = A^T / (||A||_1 ||A||_inf), float64."""
  eye = np.eye(a.shape[-1])
  denom = np.abs(a).sum(0).max() * np.abs(a).sum(1).max()
  z = a.T / denom
  for _ in range(iterations):
    az = a @ z
    z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
  return z


def np_landmarks(x, m, real):
  """x [n, d]; token i in segment floor(i m / n); mean over real tokens."""
  n = x.shape[0]
  seg = (np.arange(n) * m) // n
  means, valid = np.zeros((m, x.shape[1])), np.zeros(m, bool)
  for j in range(m):
    sel = (seg == j) & real
    if sel.any():
      means[j], valid[j] = x[sel].mean(0), True
  return means, valid


def np_nystrom(
  q, k, v, m, key_padding=None, query_padding=None, iterations=6, scale=None, conv_kernel=None
):
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, lq, h, d = q.shape
  lk = k.shape[1]
  m = min(m, lq, lk)
  scale = 1 / np.sqrt(d) if scale is None else scale
  kp = np.ones((b, lk), bool) if key_padding is None else np.asarray(key_padding)
  qp = np.ones((b, lq), bool) if query_padding is None else np.asarray(query_padding)
  out = np.zeros((b, lq, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      qq, kk, vv = q[bi, :, hi], k[bi, :, hi], v[bi, :, hi]
      ql, qv = np_landmarks(qq, m, qp[bi])
      kl, kv = np_landmarks(kk, m, kp[bi])
      f = _np_softmax(qq @ kl.T * scale, np.broadcast_to(kv[None], (lq, m)))
      a = _np_softmax(ql @ kl.T * scale, qv[:, None] & kv[None, :])
      bw = _np_softmax(ql @ kk.T * scale, qv[:, None] & kp[bi][None, :])
      out[bi, :, hi] = f @ np_pinv_iter(a, iterations) @ (bw @ vv)
      if conv_kernel is not None:
        ks = conv_kernel.shape[0]
        vz = np.pad(vv * kp[bi][:, None], ((ks // 2, ks - 1 - ks // 2), (0, 0)))
        for i in range(lq):
          out[bi, i, hi] += conv_kernel[:, hi] @ vz[i : i + ks]
  return out


def _qkv(rng, b=2, lq=7, n=7, h=2, d=4, dv=3, dtype=np.float64):
  return (
    rng.normal(size=(b, lq, h, d)).astype(dtype),
    rng.normal(size=(b, n, h, d)).astype(dtype),
    rng.normal(size=(b, n, h, dv)).astype(dtype),
  )


def _exact(q, k, v, valid=None):
  s = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(q.shape[-1])
  return np.einsum('bhqk,bkhd->bqhd', _np_softmax(s, valid), v)


@pytest.mark.parametrize('n, m', [(8, 4), (7, 3), (9, 4)])
def test_matches_numpy_reference(x64, n, m):
  rng = np.random.default_rng(0)
  q, k, v = _qkv(rng, lq=n, n=n)
  got = nystrom_attention(q, k, v, m, scale=0.6)
  np.testing.assert_allclose(
    np.asarray(got), np_nystrom(q, k, v, m, scale=0.6), rtol=1e-9, atol=1e-10
  )


def test_matches_numpy_reference_masked_and_conv(x64):
  rng = np.random.default_rng(1)
  q, k, v = _qkv(rng, lq=9, n=9)
  pad = np.ones((2, 9), bool)
  pad[0, 7:] = False
  pad[1, 2:4] = False  # a whole landmark segment (tokens 2, 3 for m = 4) masked
  pad[1, 8] = False
  kernel = rng.normal(size=(5, 2))
  got = nystrom_attention(q, k, v, 4, mask=pad, conv_kernel=kernel, pinv_iterations=8)
  ref = np_nystrom(q, k, v, 4, key_padding=pad, query_padding=pad, iterations=8, conv_kernel=kernel)
  assert np.all(np.isfinite(np.asarray(got)))
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-9, atol=1e-10)
  # A flax-style [b, h, q, k] mask gives the same query and key padding.
  got4 = nystrom_attention(
    q,
    k,
    v,
    4,
    mask=pad[:, None, :, None] & pad[:, None, None, :],
    conv_kernel=kernel,
    pinv_iterations=8,
  )
  np.testing.assert_allclose(np.asarray(got4), np.asarray(got), rtol=1e-12, atol=1e-12)


def test_cross_attention_reference(x64):
  rng = np.random.default_rng(2)
  q, k, v = _qkv(rng, lq=5, n=8)
  pad = np.ones((2, 8), bool)
  pad[1, 6:] = False
  got = nystrom_attention(q, k, v, 4, mask=pad)
  np.testing.assert_allclose(
    np.asarray(got), np_nystrom(q, k, v, 4, key_padding=pad), rtol=1e-9, atol=1e-10
  )


def test_as_many_landmarks_as_tokens_is_exact(x64):
  rng = np.random.default_rng(3)
  q, k, v = _qkv(rng, lq=7, n=7)
  got = nystrom_attention(q, k, v, 7, pinv_iterations=40)
  np.testing.assert_allclose(np.asarray(got), _exact(q, k, v), rtol=1e-8, atol=1e-9)
  # More landmarks than tokens are clamped to the length: exact as well.
  got = nystrom_attention(q, k, v, 64, pinv_iterations=40)
  np.testing.assert_allclose(np.asarray(got), _exact(q, k, v), rtol=1e-8, atol=1e-9)
  # With padding: exact softmax over the real keys at the real queries.
  pad = np.ones((2, 7), bool)
  pad[1, 5:] = False
  got = nystrom_attention(q, k, v, 7, mask=pad, pinv_iterations=40)
  ref = _exact(q, k, v, pad[:, None, None, :])
  np.testing.assert_allclose(np.asarray(got)[pad], ref[pad], rtol=1e-8, atol=1e-9)


def test_as_many_landmarks_as_tokens_float32_default_iterations():
  rng = np.random.default_rng(4)
  # q close to k with a large norm: A is near-diagonal and well conditioned,
  # the regime where the paper's 6 iterations suffice.
  x = rng.normal(size=(2, 8, 2, 8)) * 2.0
  q = x.astype(np.float32)
  k = (x + 0.1 * rng.normal(size=x.shape)).astype(np.float32)
  v = rng.normal(size=(2, 8, 2, 4)).astype(np.float32)
  got = nystrom_attention(q, k, v, 8)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), _exact(q, k, v), atol=1e-4)
  # Generic random inputs need a few more iterations, but get there in float32.
  q, k, v = _qkv(rng, lq=8, n=8, dtype=np.float32)
  got = nystrom_attention(q, k, v, 8, pinv_iterations=20)
  np.testing.assert_allclose(np.asarray(got), _exact(q, k, v), atol=1e-4)


def test_iterative_pinv_converges_to_numpy_pinv(x64):
  rng = np.random.default_rng(5)
  a = _np_softmax(rng.normal(size=(6, 6)) * 2.0)
  z = np.asarray(iterative_pinv(jnp.asarray(a), 30))
  np.testing.assert_allclose(z, np.linalg.pinv(a), rtol=1e-8, atol=1e-8)
  np.testing.assert_allclose(z, np_pinv_iter(a, 30), rtol=1e-10, atol=1e-10)
  # Rank deficient (a zero row and column, as for a masked landmark): still pinv.
  a2 = a.copy()
  a2[2, :] = 0
  a2[:, 4] = 0
  z2 = np.asarray(iterative_pinv(jnp.asarray(a2), 40))
  np.testing.assert_allclose(z2, np.linalg.pinv(a2), rtol=1e-7, atol=1e-7)
  # Batched: each matrix uses its own norms.
  batch = np.stack([a, 0.5 * a + 0.5 * np.eye(6)])
  zb = np.asarray(iterative_pinv(jnp.asarray(batch), 30))
  np.testing.assert_allclose(zb, np.linalg.pinv(batch), rtol=1e-8, atol=1e-8)


def test_iterative_pinv_float32_for_bf16_input():
  a = jnp.asarray(_np_softmax(np.random.default_rng(6).normal(size=(5, 5)) * 3), jnp.bfloat16)
  z = iterative_pinv(a, 6)
  assert z.dtype == jnp.float32


def test_padded_keys_do_not_matter():
  rng = np.random.default_rng(7)
  q, k, v = _qkv(rng, lq=10, n=10, dtype=np.float32)
  pad = np.ones((2, 10), bool)
  pad[0, 8:] = False
  pad[1, 3:6] = False
  k2, v2 = k.copy(), v.copy()
  k2[~pad] = 1e3 * rng.normal(size=k2[~pad].shape)
  v2[~pad] = 1e3 * rng.normal(size=v2[~pad].shape)
  kernel = jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)
  for conv in (None, kernel):
    out1 = nystrom_attention(q, k, v, 4, mask=pad, conv_kernel=conv)
    out2 = nystrom_attention(q, k2, v2, 4, mask=pad, conv_kernel=conv)
    np.testing.assert_allclose(np.asarray(out1), np.asarray(out2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('case', ['bf16', 'large_norm'])
def test_finite_outputs_and_grads(case):
  rng = np.random.default_rng(8)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, lq=10, n=10))
  if case == 'bf16':
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  else:
    q, k = 100 * q, 100 * k
  pad = np.ones((2, 10), bool)
  pad[1, 7:] = False

  def loss(q, k, v):
    return jnp.sum(nystrom_attention(q, k, v, 4, mask=pad).astype(jnp.float32) ** 2)

  out = nystrom_attention(q, k, v, 4, mask=pad)
  assert out.dtype == v.dtype
  assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
  for g in jax.grad(loss, argnums=(0, 1, 2))(q, k, v):
    assert bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))


def test_depthwise_conv_skip_shape_check():
  v = jnp.zeros((1, 6, 2, 3))
  with pytest.raises(ValueError, match='kernel_size'):
    depthwise_conv_skip(v, jnp.zeros((3, 4)))
  # A centred delta kernel is the identity.
  delta = jnp.zeros((5, 2)).at[2].set(1.0)
  x = jnp.asarray(np.random.default_rng(9).normal(size=(1, 6, 2, 3)), jnp.float32)
  np.testing.assert_allclose(np.asarray(depthwise_conv_skip(x, delta)), np.asarray(x))


def test_errors():
  q = k = v = jnp.zeros((1, 6, 2, 4))
  with pytest.raises(ValueError, match="'nystrom' has no causal form"):
    ea.mechanism_module('nystrom', causal=True)
  with pytest.raises(ValueError, match='num_landmarks'):
    nystrom_attention(q, k, v, 0)
  with pytest.raises(ValueError, match='q_length == kv_length'):
    nystrom_attention(q[:, :4], k, v, 2, conv_kernel=jnp.zeros((3, 2)))


def test_module_init_apply():
  rng = np.random.default_rng(10)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, lq=9, n=9))
  mod = ea.mechanism_module(
    'nystrom', param_dtype=jnp.bfloat16, options=dict(num_landmarks=3, conv_kernel_size=5)
  )
  variables = jax.jit(mod.init)(jax.random.PRNGKey(0), q, k, v)
  kernel = variables['params']['conv_kernel']
  assert kernel.shape == (5, 2) and kernel.dtype == jnp.bfloat16
  out = jax.jit(mod.apply)(variables, q, k, v)
  assert out.shape == (2, 9, 2, 3) and out.dtype == jnp.float32
  np.testing.assert_allclose(
    np.asarray(out),
    np.asarray(nystrom_attention(q, k, v, 3, conv_kernel=kernel)),
    rtol=1e-6,
    atol=1e-6,
  )
  # Default: no parameters; 32 landmarks clamped to the sequence length (exact).
  mod = ea.mechanism_module('nystrom', options={'pinv_iterations': 20})
  variables = jax.jit(mod.init)(jax.random.PRNGKey(0), q, k, v)
  assert not variables.get('params')
  out = jax.jit(mod.apply)(variables, q, k, v)
  np.testing.assert_allclose(np.asarray(out), _exact(q, k, v), atol=1e-4)

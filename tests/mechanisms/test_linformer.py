"""Tests of efficient_attn.mechanisms.linformer against a float64 NumPy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn.mechanisms.linformer import linformer_attention
from efficient_attn.mechanisms.linformer import linformer_projection_init


def _np_softmax(s):
  s = s - s.max(-1, keepdims=True)
  e = np.exp(s)
  return e / e.sum(-1, keepdims=True)


def np_linformer(q, k, v, e, f, key_padding=None, scale=None):
  """out[b, :, h] = softmax(q_h (E_h k_h)^T * scale) (F_h v_h), float64."""
  q, k, v, e, f = (np.asarray(x, np.float64) for x in (q, k, v, e, f))
  n, h = k.shape[1], k.shape[2]
  e = np.broadcast_to(e if e.ndim == 3 else e[None], (h,) + e.shape[-2:])[..., :n]
  f = np.broadcast_to(f if f.ndim == 3 else f[None], (h,) + f.shape[-2:])[..., :n]
  if key_padding is not None:
    keep = np.asarray(key_padding, np.float64)[:, :, None, None]
    k, v = k * keep, v * keep
  scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
  out = np.zeros(q.shape[:3] + (v.shape[-1],))
  for bi in range(q.shape[0]):
    for hi in range(h):
      kc = e[hi] @ k[bi, :, hi]
      vc = f[hi] @ v[bi, :, hi]
      out[bi, :, hi] = _np_softmax(q[bi, :, hi] @ kc.T * scale) @ vc
  return out


def _qkv(rng, b=2, lq=6, n=6, h=2, d=4, dv=3, dtype=np.float64):
  return (
    rng.normal(size=(b, lq, h, d)).astype(dtype),
    rng.normal(size=(b, n, h, d)).astype(dtype),
    rng.normal(size=(b, n, h, dv)).astype(dtype),
  )


@pytest.mark.parametrize('proj_shape', ['per_head', 'shared_2d', 'shared_3d'])
def test_matches_numpy_reference(x64, proj_shape):
  rng = np.random.default_rng(0)
  q, k, v = _qkv(rng, lq=5, n=7)
  h, kp, max_len = 2, 3, 10  # n = 7 < max_length: first 7 columns used
  shape = {'per_head': (h, kp, max_len), 'shared_2d': (kp, max_len), 'shared_3d': (1, kp, max_len)}[
    proj_shape
  ]
  e, f = rng.normal(size=shape), rng.normal(size=shape)
  pad = np.ones((2, 7), bool)
  pad[1, 5:] = False
  run = jax.jit(functools.partial(linformer_attention, scale=0.7))  # one program per mask
  for mask in (None, pad):
    got = run(
      jnp.asarray(q),
      jnp.asarray(k),
      jnp.asarray(v),
      jnp.asarray(e),
      jnp.asarray(f),
      mask=None if mask is None else jnp.asarray(mask),
    )
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(
      np.asarray(got), np_linformer(q, k, v, e, f, mask, scale=0.7), rtol=1e-10, atol=1e-12
    )


def test_shorter_input_equals_zero_padding(x64):
  rng = np.random.default_rng(1)
  q, k, v = _qkv(rng, n=6)
  e, f = rng.normal(size=(2, 3, 9)), rng.normal(size=(2, 3, 9))
  zpad = lambda x: np.pad(x, ((0, 0), (0, 3), (0, 0), (0, 0)))
  short, padded = jax.jit(
    lambda q, k, v, kp, vp: (
      linformer_attention(q, k, v, e, f),
      linformer_attention(q, kp, vp, e, f),
    )
  )(q, k, v, zpad(k), zpad(v))
  np.testing.assert_allclose(np.asarray(short), np.asarray(padded), rtol=1e-12, atol=1e-12)


def test_identity_projections_equal_exact_softmax(x64):
  rng = np.random.default_rng(2)
  q, k, v = _qkv(rng, n=6)
  eye = np.eye(6)
  got = jax.jit(linformer_attention)(q, k, v, eye, eye)
  ref = np.einsum('bhqk,bkhd->bqhd', _np_softmax(np.einsum('bqhd,bkhd->bhqk', q, k) / 2.0), v)
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-12)


def test_padded_keys_do_not_matter():
  rng = np.random.default_rng(3)
  q, k, v = _qkv(rng, n=8, lq=8, dtype=np.float32)
  e, f = rng.normal(size=(4, 8)).astype(np.float32), rng.normal(size=(4, 8)).astype(np.float32)
  pad = np.ones((2, 8), bool)
  pad[0, 6:] = False
  pad[1, 3:] = False
  k2, v2 = k.copy(), v.copy()
  k2[~pad] = 1e3 * rng.normal(size=k2[~pad].shape)
  v2[~pad] = 1e3 * rng.normal(size=v2[~pad].shape)
  # A flax-style [b, h, q, k] padding mask is reduced to the same key padding.
  flax_mask = pad[:, None, :, None] & pad[:, None, None, :]
  out1, out2, out3 = jax.jit(
    lambda q, k, v, k2, v2: (
      linformer_attention(q, k, v, e, f, mask=pad),
      linformer_attention(q, k2, v2, e, f, mask=pad),
      linformer_attention(q, k2, v2, e, f, mask=flax_mask),
    )
  )(q, k, v, k2, v2)
  np.testing.assert_allclose(np.asarray(out1), np.asarray(out2), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(out1), np.asarray(out3), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('case', ['bf16', 'large_norm'])
def test_finite_outputs_and_grads(case):
  rng = np.random.default_rng(4)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, n=8, lq=8))
  e = jnp.asarray(linformer_projection_init(jax.random.PRNGKey(0), (4, 8)))
  if case == 'bf16':
    q, k, v, e = (x.astype(jnp.bfloat16) for x in (q, k, v, e))
  else:
    q, k = 100 * q, 100 * k

  def loss(q, k, v, e):
    return jnp.sum(linformer_attention(q, k, v, e, e).astype(jnp.float32) ** 2)

  out, grads = jax.jit(
    lambda *a: (linformer_attention(*a, a[3]), jax.grad(loss, argnums=(0, 1, 2, 3))(*a))
  )(q, k, v, e)
  assert out.dtype == v.dtype
  assert np.all(np.isfinite(np.asarray(out).astype(np.float32)))
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g).astype(np.float32)))


def test_errors():
  rng = np.random.default_rng(5)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, n=6, lq=6))
  key = jax.random.PRNGKey(0)
  mod = lambda max_length=8, causal=False, **options: ea.mechanism_module(
    'linformer', causal=causal, max_length=max_length, options=options
  )
  with pytest.raises(ValueError, match="'linformer' has no causal form"):
    mod(k_proj=4, causal=True)
  with pytest.raises(ValueError, match='max_length'):
    mod(max_length=None, k_proj=4)
  with pytest.raises(ValueError, match=r'length 6 exceeds max_length=4'):
    mod(max_length=4, k_proj=2).init(key, q, k, v)
  with pytest.raises(ValueError, match=r'length 6 exceeds max_length 5'):
    linformer_attention(q, k, v, jnp.ones((2, 5)), jnp.ones((2, 5)))
  with pytest.raises(ValueError, match="sharing='bogus'.*'headwise'"):
    mod(sharing='bogus')
  with pytest.raises(ValueError, match="sharing='layerwise' needs the model's shared"):
    mod(sharing='layerwise').init(key, q, k, v)
  with pytest.raises(ValueError, match='heads'):
    linformer_attention(q, k, v, jnp.ones((3, 2, 8)), jnp.ones((3, 2, 8)))


@pytest.mark.parametrize(
  'sharing, expected',
  [
    ('none', {'e_proj': (2, 4, 8), 'f_proj': (2, 4, 8)}),
    ('headwise', {'e_proj': (4, 8), 'f_proj': (4, 8)}),
    ('kv', {'kv_proj': (4, 8)}),
    ('layerwise', {}),
  ],
)
def test_module_params_and_apply(sharing, expected):
  rng = np.random.default_rng(6)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, n=6, lq=6))
  shared = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32) if sharing == 'layerwise' else None
  mod = ea.mechanism_module(
    'linformer',
    max_length=8,
    param_dtype=jnp.bfloat16,
    options=dict(k_proj=4, sharing=sharing),
    shared_params={'kv_proj': shared} if shared is not None else None,
  )
  variables = jax.jit(mod.init)(jax.random.PRNGKey(0), q, k, v)
  params = variables.get('params', {})
  assert {name: p.shape for name, p in params.items()} == expected
  assert all(p.dtype == jnp.bfloat16 for p in params.values())
  e = {'none': 'e_proj', 'headwise': 'e_proj', 'kv': 'kv_proj'}.get(sharing)
  e_arr = shared if e is None else params[e]
  f_arr = shared if e is None else params['f_proj' if sharing in ('none', 'headwise') else e]
  out, want = jax.jit(
    lambda variables, e_arr, f_arr: (
      mod.apply(variables, q, k, v),
      linformer_attention(q, k, v, e_arr, f_arr),
    )
  )(variables, e_arr, f_arr)
  assert out.shape == (2, 6, 2, 3) and out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_k_proj_clamped_to_max_length_and_init_scale():
  q = k = v = jnp.zeros((1, 4, 1, 2))
  params = jax.eval_shape(  # the parameters' shapes: nothing to compile
    ea.mechanism_module('linformer', max_length=5, options={'k_proj': 64}).init,
    jax.random.PRNGKey(0),
    q,
    k,
    v,
  )
  assert params['params']['e_proj'].shape == (5, 5)
  var = jax.jit(lambda key: jnp.var(linformer_projection_init(key, (3, 64, 512))))
  np.testing.assert_allclose(float(var(jax.random.PRNGKey(1))), 1 / (64 + 512), rtol=0.05)


def test_layerwise_sharing_in_a_model():
  """The Encoder creates one E = F for every layer; each layer projects with it."""
  from efficient_attn.models import Encoder  # pylint: disable=g-import-not-at-top
  from efficient_attn.models import TransformerConfig  # pylint: disable=g-import-not-at-top

  config = TransformerConfig(
    d_model=8,
    depth=2,
    num_heads=2,
    mlp_dim=8,
    mechanism='linformer',
    options={'k_proj': 3, 'sharing': 'layerwise'},
    max_length=8,
  )
  x = jnp.asarray(np.random.default_rng(7).normal(size=(1, 6, 8)), jnp.float32)

  @jax.jit  # one compiled program (eagerly, every operation would compile alone)
  def run(x):
    params = Encoder(config).init(jax.random.PRNGKey(0), x)['params']
    return params, jax.grad(lambda p: jnp.sum(Encoder(config).apply({'params': p}, x) ** 2))(params)

  params, grads = run(x)
  assert params['shared_attention_kv_proj'].shape == (3, 8)
  assert not params['block_0']['attention'].get('mechanism')  # no per-layer projections
  g = np.asarray(grads['shared_attention_kv_proj'])
  assert bool(jnp.all(g[:, :6] != 0))  # used by the 6 tokens
  assert bool(jnp.all(g[:, 6:] == 0))  # columns beyond the input length are unused

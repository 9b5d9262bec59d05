"""Tests of efficient_attn.mechanisms.synthesizer against float64 NumPy references."""

import functools

from helpers import PAD
from helpers import assert_no_lookahead
from helpers import value_and_grads
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.mechanisms import synthesizer
from efficient_attn.mechanisms.synthesizer import param_specs
from efficient_attn.mechanisms.synthesizer import synthesizer_attention
from efficient_attn.ops.per_head_mlp import init_from_specs

H, D, DV = 2, 4, 3


def _qkv(rng, b=2, lq=10, n=10, dtype=np.float64):
  return (
    rng.normal(size=(b, lq, H, D)).astype(dtype),
    rng.normal(size=(b, n, H, D)).astype(dtype),
    rng.normal(size=(b, n, H, DV)).astype(dtype),
  )


def _params(kind, max_length=12, mix=False, seed=0, dtype=jnp.float32, **options):
  """Random N(0, 0.7^2) arrays of `param_specs`' shapes (NumPy: no RNG to compile)."""
  specs = param_specs(
    heads=H, head_dim=D, max_length=max_length, kind=kind, mix_with_dot=mix, **options
  )
  rng = np.random.default_rng(seed)
  return {n: jnp.asarray(0.7 * rng.normal(size=shape), dtype) for n, (shape, _) in specs.items()}


def _np_mlp(x, p, prefix, h):
  w1, b1, w2, b2 = (np.asarray(p[f'{prefix}_{n}'], np.float64)[h] for n in ('w1', 'b1', 'w2', 'b2'))
  return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def np_synthesizer(q, k, v, params, kind, key_padding=None, causal=False, mix=False, scale=None):
  """Float64 loop over (batch, head) of the formulas in the module docstring."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, lq, h, d = q.shape
  n = v.shape[1]
  scale = 1 / np.sqrt(d) if scale is None else scale
  out = np.zeros((b, lq, h, v.shape[-1]))
  r0 = n - lq if causal else 0  # causal: query i is position i + n - lq
  for bi in range(b):
    for hi in range(h):
      x = q[bi, :, hi]
      if kind == 'dense':
        logits = _np_mlp(x, params, 'dense', hi)[:, :n]
      elif kind == 'random':
        logits = np.asarray(params['random'], np.float64)[hi, r0 : r0 + lq, :n]
      elif kind == 'factorized_dense':
        fa, fb = _np_mlp(x, params, 'fa', hi), _np_mlp(x, params, 'fb', hi)
        nb = fb.shape[1]
        logits = np.array([[fa[i, t // nb] * fb[i, t % nb] for t in range(n)] for i in range(lq)])
      else:
        r1 = np.asarray(params['random1'], np.float64)[hi]
        r2 = np.asarray(params['random2'], np.float64)[hi]
        logits = r1[r0 : r0 + lq] @ r2[:n].T
      if mix:
        w = float(np.asarray(params['dot_weight'], np.float64)[hi])
        logits = logits + w * scale * x @ k[bi, :, hi].T
      for i in range(lq):
        allowed = np.ones(n, bool)
        if key_padding is not None:
          allowed &= np.asarray(key_padding[bi], bool)
        if causal:
          allowed &= np.arange(n) <= i + n - lq
        if allowed.any():
          s = logits[i][allowed]
          p = np.exp(s - s.max())
          out[bi, i, hi] = (p / p.sum()) @ v[bi, allowed, hi]
  return out


def test_random_equals_its_formula(x64):
  rng = np.random.default_rng(0)
  _, _, v = _qkv(rng, n=9)
  r = rng.normal(size=(H, 12, 12))
  q = np.zeros((2, 9, H, D))
  for trainable in (True, False):
    got = synthesizer_attention(
      q, None, v, {'random': r}, kind='random', trainable_random=trainable
    )
    assert got.dtype == jnp.float64
    for hi in range(H):
      a = np.exp(r[hi, :9, :9])
      a /= a.sum(-1, keepdims=True)
      np.testing.assert_allclose(
        np.asarray(got)[:, :, hi], np.einsum('qk,bkd->bqd', a, v[:, :, hi]), rtol=1e-12, atol=1e-12
      )


@pytest.mark.parametrize('kind', synthesizer.KINDS)
def test_matches_numpy_reference(x64, kind):
  rng = np.random.default_rng(1)
  q, k, v = _qkv(rng, lq=10, n=10)  # shorter than max_length 12: leading block used
  for mix, mask, causal in ((False, None, False), (True, PAD, False), (True, PAD, True)):
    params = {n: np.asarray(p, np.float64) for n, p in _params(kind, mix=mix).items()}
    got = synthesizer_attention(
      q, k, v, params, mask=mask, causal=causal, kind=kind, mix_with_dot=mix, scale=0.6
    )
    assert got.dtype == jnp.float64
    ref = np_synthesizer(q, k, v, params, kind, mask, causal, mix, scale=0.6)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('kind', ['random', 'factorized_random'])
def test_flax_mask_and_cross_lengths(x64, kind):
  """q_length 7 < kv_length 10: leading rows, or, when causal, the last 7 positions."""
  rng = np.random.default_rng(2)
  q, k, v = _qkv(rng, lq=10, n=10)
  params = {n: np.asarray(p, np.float64) for n, p in _params(kind).items()}
  flax_mask = np.ones((2, 1, 7, 10), bool) & PAD[:, None, None, :]
  for causal in (False, True):
    got = synthesizer_attention(q[:, 3:], k, v, params, mask=flax_mask, causal=causal, kind=kind)
    ref = np_synthesizer(q[:, 3:], k, v, params, kind, PAD, causal=causal)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-10, atol=1e-12)
  # Causal: the last 7 queries alone get the last 7 rows of the full output.
  full = synthesizer_attention(q, k, v, params, mask=PAD, causal=True, kind=kind)
  np.testing.assert_allclose(np.asarray(got), np.asarray(full)[:, 3:], rtol=1e-12, atol=1e-12)


def _all_kinds(q, k, v, params, mix, **kwargs):
  """Every kind's output concatenated along v_dim (one compilation checks them all).

  `params` maps each kind to its parameters.
  """
  return jnp.concatenate(
    [
      synthesizer_attention(q, k, v, params[kind], kind=kind, mix_with_dot=mix, **kwargs)
      for kind in synthesizer.KINDS
    ],
    axis=-1,
  )


def _all_params(mix, dtype=jnp.float32):
  return {kind: _params(kind, mix=mix, dtype=dtype) for kind in synthesizer.KINDS}


@pytest.mark.parametrize('mix', [False, True])
def test_no_lookahead(mix):
  rng = np.random.default_rng(3)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, n=10))
  fn = functools.partial(_all_kinds, params=_all_params(mix), mix=mix, causal=True)
  assert_no_lookahead(fn, (q, k, v), past_args=(1, 2) if mix else (2,))


def test_random_matrix_has_no_lookahead():
  """d out_t / d R[:, :, j] = 0 for j > t: the future columns of R are never read."""
  rng = np.random.default_rng(4)
  _, _, v = _qkv(rng, n=10, dtype=np.float32)
  q = jnp.zeros((2, 10, H, D))
  r = jnp.asarray(rng.normal(size=(H, 12, 12)), jnp.float32)

  def fn(v, r_cols):  # r_cols [1, columns, heads * rows]: axis 1 indexes key positions
    rr = jnp.transpose(r_cols[0].reshape(12, H, 12), (1, 2, 0))
    return synthesizer_attention(q, None, v, {'random': rr}, causal=True, kind='random')

  r_cols = jnp.transpose(r, (2, 0, 1)).reshape(1, 12, H * 12)
  assert_no_lookahead(fn, (v, r_cols), past_args=(0, 1))


def test_padded_keys_do_not_matter():
  rng = np.random.default_rng(5)
  q, k, v = _qkv(rng, dtype=np.float32)
  k2, v2 = k.copy(), v.copy()
  k2[~PAD] = 1e3 * rng.normal(size=k2[~PAD].shape)
  v2[~PAD] = 1e3 * rng.normal(size=v2[~PAD].shape)
  params = _all_params(mix=True)
  run = jax.jit(
    lambda q, k, v: [
      _all_kinds(q, k, v, params, mix=True, mask=PAD, causal=causal) for causal in (False, True)
    ]
  )
  for out1, out2 in zip(run(q, k, v), run(q, k2, v2)):
    np.testing.assert_allclose(np.asarray(out1)[PAD], np.asarray(out2)[PAD], rtol=1e-5, atol=1e-5)


def test_bf16_finite_outputs_and_grads():
  rng = np.random.default_rng(6)
  q, k, v = (jnp.asarray(4 * x, jnp.bfloat16) for x in _qkv(rng, n=10))
  fn = functools.partial(_all_kinds, mix=True, mask=PAD, causal=True)
  out, grads = value_and_grads(fn, num_args=4)(q, k, v, _all_params(True, jnp.bfloat16))
  assert out.dtype == jnp.bfloat16 and out.shape == (2, 10, H, 4 * DV)
  for x in [out] + jax.tree.leaves(grads):
    assert x.dtype == jnp.bfloat16
    assert np.all(np.isfinite(np.asarray(x, np.float32)))
    assert np.any(np.asarray(x, np.float32) != 0)


def test_fixed_random_gets_no_gradient():
  rng = np.random.default_rng(7)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng))
  params = {kind: _params(kind) for kind in ('random', 'factorized_random')}

  @jax.jit
  @jax.grad
  def grads(params):
    return sum(
      jnp.sum(
        synthesizer_attention(q, k, v, params[kind], kind=kind, trainable_random=kind == 'random')
        ** 2
      )
      for kind in params
    )

  g = grads(params)
  assert np.any(np.asarray(g['random']['random']) != 0)
  assert not any(np.any(np.asarray(x)) for x in jax.tree.leaves(g['factorized_random']))


def test_param_specs_shapes():
  def shapes(**kw):
    return {n: s for n, (s, _) in param_specs(heads=2, head_dim=4, **kw).items()}

  assert shapes(max_length=12, kind='dense') == {
    'dense_w1': (2, 4, 4),
    'dense_b1': (2, 4),
    'dense_w2': (2, 4, 12),
    'dense_b2': (2, 12),
  }
  assert shapes(max_length=12, kind='random', mix_with_dot=True) == {
    'random': (2, 12, 12),
    'dot_weight': (2,),
  }
  fd = shapes(max_length=12, kind='factorized_dense', hidden_dim=5)
  assert fd['fa_w1'] == (2, 4, 5) and fd['fa_w2'] == (2, 5, 3) and fd['fb_w2'] == (2, 5, 4)
  assert shapes(max_length=12, kind='factorized_dense', factor_a=2)['fb_b2'] == (2, 6)
  assert shapes(max_length=12, kind='factorized_random', factor_rank=3) == {
    'random1': (2, 12, 3),
    'random2': (2, 12, 3),
  }
  r = init_from_specs(
    param_specs(heads=2, head_dim=4, max_length=64, kind='factorized_random', factor_rank=16),
    jax.random.PRNGKey(0),
  )
  prod = jnp.einsum('hik,hjk->hij', r['random1'], r['random2'])
  assert 0.8 < float(jnp.std(prod)) < 1.2  # unit-variance logits at initialisation


def test_errors():
  rng = np.random.default_rng(8)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng, lq=14, n=14))
  with pytest.raises(ValueError, match='max_length'):
    param_specs(heads=2, head_dim=4, kind='dense')
  with pytest.raises(
    ValueError, match="kind='bogus' is not valid; it must be one of 'dense', 'random'"
  ):
    param_specs(heads=2, head_dim=4, max_length=8, kind='bogus')
  with pytest.raises(ValueError, match='factor_a'):
    param_specs(heads=2, head_dim=4, max_length=12, kind='factorized_dense', factor_a=5)
  with pytest.raises(
    ValueError, match="kind='bogus' is not valid; it must be one of 'dense', 'random'"
  ):
    synthesizer_attention(q, k, v, {}, kind='bogus')
  for kind in synthesizer.KINDS:
    with pytest.raises(ValueError, match='length 14 exceeds max_length 12'):
      synthesizer_attention(q, k, v, _params(kind), kind=kind)
  with pytest.raises(ValueError, match="lack 'random'"):
    synthesizer_attention(q, k, v, _params('dense'), kind='random')
  with pytest.raises(ValueError, match="lack 'dot_weight'"):
    synthesizer_attention(q[:, :10], k[:, :10], v[:, :10], _params('dense'), mix_with_dot=True)
  with pytest.raises(ValueError, match='heads'):
    synthesizer_attention(
      q[:, :10, :1], k[:, :10, :1], v[:, :10, :1], _params('random'), kind='random'
    )

"""Tests of efficient_attn.mechanisms.sinkhorn against float64 NumPy references."""

import functools

from helpers import PAD
from helpers import assert_no_lookahead
from helpers import value_and_grads
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.mechanisms import sinkhorn
from efficient_attn.mechanisms.sinkhorn import param_specs
from efficient_attn.mechanisms.sinkhorn import sinkhorn_attention
from efficient_attn.mechanisms.sinkhorn import sinkhorn_attention_from_logits
from efficient_attn.mechanisms.softmax import softmax_attention

H, D, DV = 2, 4, 3
_OPTIONS = ('causal', 'block_size', 'sinkhorn_iterations', 'temperature', 'sortcut_k', 'scale')
# Jitted once for every float64 check (a compilation per static setting).
_run = jax.jit(sinkhorn_attention, static_argnames=_OPTIONS)
_run_logits = jax.jit(sinkhorn_attention_from_logits, static_argnames=_OPTIONS)
_balance = jax.jit(sinkhorn.gumbel_sinkhorn, static_argnums=(1, 2, 3))


def _qkv(rng, b=2, lq=16, n=16, dtype=np.float64):
  return (
    rng.normal(size=(b, lq, H, D)).astype(dtype),
    rng.normal(size=(b, n, H, D)).astype(dtype),
    rng.normal(size=(b, n, H, DV)).astype(dtype),
  )


def _params(max_length, block_size, dtype=jnp.float32, seed=0):
  """Random N(0, 1) sorting networks of `param_specs`' shapes (NumPy: no RNG to compile)."""
  specs = param_specs(
    heads=H, head_dim=D, max_length=max_length, block_size=block_size, sort_hidden_dim=5
  )
  rng = np.random.default_rng(seed)
  return {n: jnp.asarray(rng.normal(size=shape), dtype) for n, (shape, _) in specs.items()}


def _lse(x, axis):
  """log-sum-exp; -inf for an all -inf slice."""
  m = np.max(x, axis=axis, keepdims=True)
  m = np.where(np.isfinite(m), m, 0.0)
  with np.errstate(divide='ignore'):
    return m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def np_sinkhorn(
  q,
  k,
  v,
  params,
  block_size,
  iterations=8,
  temperature=0.75,
  causal=False,
  sortcut_k=0,
  key_padding=None,
  scale=None,
):
  """Float64 Sinkhorn attention, one (batch, head) and one query at a time."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  p = {name: np.asarray(x, np.float64) for name, x in params.items()}
  b, n, h, d = k.shape
  nb, bs = n // block_size, block_size
  real = np.ones((b, n), bool) if key_padding is None else np.asarray(key_padding, bool)
  scale = 1 / np.sqrt(d) if scale is None else scale
  out = np.zeros((b, q.shape[1], h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      kz, vz = k[bi, :, hi] * real[bi, :, None], v[bi, :, hi] * real[bi, :, None]
      summ = np.zeros((nb, d))
      for i in range(nb):
        blocks = range(i) if causal else [i]
        idx = [j * bs + s for j in blocks for s in range(bs)]
        count = real[bi, idx].sum() if idx else 0
        if count:
          summ[i] = kz[idx].sum(0) / count
      hid = np.maximum(summ @ p['sort_w1'][hi] + p['sort_b1'][hi], 0)
      logits = (hid @ p['sort_w2'][hi] + p['sort_b2'][hi])[:, :nb] / temperature
      allowed = np.tril(np.ones((nb, nb), bool), -1) if causal else np.ones((nb, nb), bool)
      x = np.where(allowed, logits, -np.inf)
      with np.errstate(invalid='ignore'):
        for _ in range(iterations):
          x = np.where(allowed, x - _lse(x, 1), -np.inf)
          if causal:  # column normalisation over the rows i' <= i
            col = np.stack([_lse(x[: i + 1], 0)[0] for i in range(nb)])
          else:
            col = _lse(x, 0)
          x = np.where(allowed, x - col, -np.inf)
      perm = np.exp(x)
      ks = np.einsum('ij,jsd->isd', perm, kz.reshape(nb, bs, d))
      vs = np.einsum('ij,jsd->isd', perm, vz.reshape(nb, bs, -1))
      s_valid = perm @ real[bi].reshape(nb, bs).astype(float) > 0
      for t in range(q.shape[1]):
        if sortcut_k:
          keys = ks[:sortcut_k].reshape(-1, d)
          vals = vs[:sortcut_k].reshape(-1, vs.shape[-1])
          ok = s_valid[:sortcut_k].reshape(-1)
        else:
          i = t // bs
          local = [i * bs + s for s in range(bs)]
          keys = np.concatenate([kz[local], ks[i]])
          vals = np.concatenate([vz[local], vs[i]])
          ok = np.concatenate(
            [real[bi, local] & ((np.arange(bs) <= t % bs) | (not causal)), s_valid[i]]
          )
        if ok.any():
          sc = scale * keys[ok] @ q[bi, t, hi]
          w = np.exp(sc - sc.max())
          out[bi, t, hi] = (w / w.sum()) @ vals[ok]
  return out


PAD16 = np.tile(PAD, (1, 2))[:, :16]  # `helpers.PAD` pattern at length 16


@pytest.mark.parametrize(
  'causal, sortcut_k, lq, mask',
  [(False, 0, 16, 'pad'), (True, 0, 16, 'pad'), (False, 2, 7, 'flax')],
)
def test_matches_numpy_reference(x64, causal, sortcut_k, lq, mask):
  rng = np.random.default_rng(0)
  q, k, v = _qkv(rng, n=16, lq=lq)
  params = {n: np.asarray(p, np.float64) for n, p in _params(24, 4).items()}  # 4 of 6 blocks
  key_padding = None if mask is None else PAD16
  if mask == 'flax':
    mask = np.ones((2, 1, lq, 16), bool) & PAD16[:, None, None, :]
  elif mask == 'pad':
    mask = PAD16
  kwargs = dict(block_size=4, temperature=0.6, causal=causal, sortcut_k=sortcut_k)
  got = _run(q, k, v, params, mask=mask, scale=0.7, sinkhorn_iterations=5, **kwargs)
  assert got.dtype == jnp.float64
  ref = np_sinkhorn(q, k, v, params, key_padding=key_padding, scale=0.7, iterations=5, **kwargs)
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-10, atol=1e-12)


def _block_mask(n, bs, causal):
  """Bool [n, n]: own block (causally masked if causal) or, if causal, the previous block."""
  qb, kb = np.arange(n)[:, None] // bs, np.arange(n)[None, :] // bs
  if not causal:
    return qb == kb
  return ((qb == kb) & (np.arange(n)[None, :] <= np.arange(n)[:, None])) | (kb == qb - 1)


@pytest.mark.parametrize('causal', [False, True])
def test_forced_permutation_is_block_local_attention(x64, causal):
  """Logits 1e3 on the diagonal (causal: sub-diagonal) make P exactly I (a shift).

  Non-causal, sorted block i is then block i itself and the joint softmax over
  the doubled keys equals softmax over the own block; causal, sorted block i
  is block i - 1: the own block causally plus the whole previous block.
  """
  rng = np.random.default_rng(2)
  q, k, v = _qkv(rng)
  logits = 1e3 * np.eye(4, k=-1 if causal else 0)[None, None]
  perm = _balance(logits, 20, 0.75, causal)
  np.testing.assert_array_equal(np.asarray(perm)[0, 0], logits[0, 0] / 1e3)
  got = _run_logits(
    q, k, v, logits, mask=PAD16, causal=causal, block_size=4, sinkhorn_iterations=20
  )
  full = _block_mask(16, 4, causal)[None, None] & PAD16[:, None, None, :]
  np.testing.assert_allclose(
    np.asarray(got), np.asarray(softmax_attention(q, k, v, full)), rtol=1e-12, atol=1e-12
  )


def test_sortcut_of_all_blocks_is_full_attention(x64):
  """SortCut keeping every block of a permutation (here the reversal) is exact attention."""
  rng = np.random.default_rng(3)
  q, k, v = _qkv(rng)
  logits = 1e3 * np.eye(4)[::-1][None, None]
  got = _run_logits(q, k, v, logits, mask=PAD16, block_size=4, sortcut_k=4)
  np.testing.assert_allclose(
    np.asarray(got), np.asarray(softmax_attention(q, k, v, PAD16)), rtol=1e-12, atol=1e-12
  )


def test_sinkhorn_balancing():
  rng = np.random.default_rng(4)
  logits = jnp.asarray(rng.normal(size=(2, 6, 6)), jnp.float32)
  perm = np.asarray(_balance(logits, 50, 1.0, False))
  np.testing.assert_allclose(perm.sum(-1), 1, atol=1e-4)
  np.testing.assert_allclose(perm.sum(-2), 1, atol=1e-4)
  causal = np.asarray(_balance(logits, 8, 0.75, True))
  below = np.tril(np.ones((6, 6), bool), -1)
  assert np.all(causal[:, ~below] == 0) and np.all(causal[:, below] > 0)
  np.testing.assert_allclose(causal[:, 1, 0], 1, rtol=1e-6)  # block 1 can only take block 0


def test_gumbel_noise_only_with_rng():
  rng = np.random.default_rng(5)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng))
  params = _params(16, 4)

  @jax.jit
  def run(key):
    logits = sinkhorn.sort_logits(sinkhorn.block_summaries(k, None, 4), params, 4)
    noise = sinkhorn.sample_gumbel(key, logits.shape)
    return (
      sinkhorn_attention(q, k, v, params, block_size=4),
      sinkhorn_attention(q, k, v, params, block_size=4, rng=key),
      sinkhorn_attention_from_logits(q, k, v, logits + noise, block_size=4),
    )

  det, noisy, expected = (np.asarray(x) for x in run(jax.random.PRNGKey(1)))
  assert not np.allclose(det, noisy)
  # The noise is standard Gumbel noise on the sorting logits, the same for the same key.
  np.testing.assert_allclose(noisy, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(noisy, np.asarray(run(jax.random.PRNGKey(1))[1]))
  assert not np.allclose(noisy, np.asarray(run(jax.random.PRNGKey(2))[1]))


def test_no_lookahead():
  """Also through the sort: k feeds the block summaries and the sorted blocks."""
  rng = np.random.default_rng(6)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng))
  fn = functools.partial(sinkhorn_attention, params=_params(16, 4), causal=True, block_size=4)
  assert_no_lookahead(fn, (q, k, v))


def test_padded_keys_do_not_matter():
  rng = np.random.default_rng(7)
  q, k, v = _qkv(rng, n=10, lq=10, dtype=np.float32)
  k2, v2 = k.copy(), v.copy()
  k2[~PAD] = 1e3 * rng.normal(size=k2[~PAD].shape)
  v2[~PAD] = 1e3 * rng.normal(size=v2[~PAD].shape)
  params = _params(10, 2)
  run = jax.jit(
    lambda q, k, v: [
      sinkhorn_attention(q, k, v, params, mask=PAD, block_size=2, causal=causal, sortcut_k=cut)
      for causal, cut in ((False, 0), (True, 0), (False, 2))
    ]
  )
  for out1, out2 in zip(run(q, k, v), run(q, k2, v2)):
    np.testing.assert_allclose(np.asarray(out1)[PAD], np.asarray(out2)[PAD], rtol=1e-6, atol=1e-6)


def test_bf16_finite_outputs_and_grads():
  rng = np.random.default_rng(8)
  q, k, v = (jnp.asarray(4 * x, jnp.bfloat16) for x in _qkv(rng, n=10, lq=10))
  params = _params(10, 2, dtype=jnp.bfloat16)

  def fn(q, k, v, params):  # causal gradients are exercised by test_no_lookahead
    return sinkhorn_attention(q, k, v, params, mask=PAD, block_size=2)

  out, grads = value_and_grads(fn, num_args=4)(q, k, v, params)
  assert out.dtype == jnp.bfloat16 and out.shape == (2, 10, H, DV)
  for x in [out] + jax.tree.leaves(grads):
    assert np.all(np.isfinite(np.asarray(x, np.float32)))
    assert np.any(np.asarray(x, np.float32) != 0)


def test_param_specs():
  specs = param_specs(heads=2, head_dim=4, max_length=32, block_size=8, sinkhorn_iterations=3)
  assert {n: s for n, (s, _) in specs.items()} == {
    'sort_w1': (2, 4, 4),
    'sort_b1': (2, 4),
    'sort_w2': (2, 4, 4),
    'sort_b2': (2, 4),
  }
  with pytest.raises(ValueError, match='max_length'):
    param_specs(heads=2, head_dim=4, block_size=8)
  with pytest.raises(ValueError, match='max_length=30 must be a positive multiple of block_size=8'):
    param_specs(heads=2, head_dim=4, max_length=30, block_size=8)


def test_errors():
  rng = np.random.default_rng(9)
  q, k, v = (jnp.asarray(x, jnp.float32) for x in _qkv(rng))
  params = _params(16, 4)
  run = functools.partial(sinkhorn_attention, q, k, v, params)
  with pytest.raises(ValueError, match='length 16 is not divisible by block_size=5'):
    run(block_size=5)
  with pytest.raises(ValueError, match=r'length 16 exceeds max_length 8 \(= 4 blocks'):
    run(block_size=2)
  with pytest.raises(ValueError, match='sortcut_k=1 .* non-causal'):
    run(block_size=4, sortcut_k=1, causal=True)
  with pytest.raises(ValueError, match=r'sortcut_k must be in \[0, num_blocks=4\], got 5'):
    run(block_size=4, sortcut_k=5)
  with pytest.raises(
    ValueError,
    match=r'sinkhorn_attention: temperature=0.0 is not valid; it must be a finite float > 0.0$',
  ):
    run(block_size=4, temperature=0.0)
  with pytest.raises(
    ValueError, match=r'sinkhorn_iterations=0 is not valid; it must be an int >= 1$'
  ):
    run(block_size=4, sinkhorn_iterations=0)
  with pytest.raises(ValueError, match='q_length == kv_length'):
    sinkhorn_attention(q[:, :8], k, v, params, block_size=4)
  with pytest.raises(ValueError, match="lack 'sort_b2'"):
    sinkhorn_attention(q, k, v, {n: p for n, p in params.items() if n != 'sort_b2'}, block_size=4)

"""Tests of efficient_attn.mechanisms.reformer against float64 NumPy references."""

from helpers import PAD
from helpers import assert_no_lookahead
from helpers import value_and_grads
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.mechanisms import reformer
from efficient_attn.mechanisms.reformer import lsh_rotations
from efficient_attn.mechanisms.reformer import reformer_attention

H, D, DV = 2, 4, 3
# One jitted function for every float64 check (a compilation per static setting).
_run = jax.jit(
  reformer_attention,
  static_argnames=('causal', 'n_buckets', 'n_hashes', 'chunk_size', 'seed', 'scale'),
)


def _qv(rng, b=2, n=16, dtype=np.float64):
  return (rng.normal(size=(b, n, H, D)).astype(dtype), rng.normal(size=(b, n, H, DV)).astype(dtype))


def _keys(x):
  """Trax's `length_normalized` keys: x / rms(x), float64."""
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + reformer.LENGTH_NORM_EPS)


def np_reformer(
  q, v, n_buckets, n_hashes, chunk_size, seed=0, causal=False, key_padding=None, scale=None
):
  """Float64 LSH attention, one query at a time, given `lsh_rotations(seed, ...)`."""
  q, v = np.asarray(q, np.float64), np.asarray(v, np.float64)
  b, n, h, d = q.shape
  rot = np.asarray(lsh_rotations(seed, h, d, n_buckets, n_hashes), np.float64)
  real = np.ones((b, n), bool) if key_padding is None else np.asarray(key_padding, bool)
  scale = 1 / np.sqrt(d) if scale is None else scale
  chunk = min(chunk_size, n)
  out = np.zeros((b, n, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      x, keys = q[bi, :, hi], _keys(q[bi, :, hi])
      outs, lses = np.zeros((n_hashes, n, v.shape[-1])), np.full((n_hashes, n), -np.inf)
      for r in range(n_hashes):
        if n_buckets == 1:
          bucket = np.zeros(n, int)
        else:
          xr = x @ rot[hi, r]
          bucket = np.argmax(np.concatenate([xr, -xr], axis=-1), axis=-1)
        bucket = np.where(real[bi], bucket, n_buckets)
        order = sorted(range(n), key=lambda i, bucket=bucket: (bucket[i], i))
        for p, i in enumerate(order):
          c = p // chunk
          if causal:  # the chunk most recent earlier keys of i's own bucket, and i
            cand = [
              j
              for j in order[max(p - chunk, 0) : p + 1]
              if real[bi, j] and bucket[j] == bucket[i] and j <= i
            ]
          else:
            cand = [j for j in order[max(c - 1, 0) * chunk : (c + 1) * chunk] if real[bi, j]]
          if not cand:
            continue
          s = np.array(
            [scale * x[i] @ keys[j] - (reformer.SELF_SCORE_PENALTY if j == i else 0) for j in cand]
          )
          lse = s.max() + np.log(np.sum(np.exp(s - s.max())))
          outs[r, i] = np.exp(s - lse) @ v[bi, cand, hi]
          lses[r, i] = lse
      for i in range(n):
        if np.isfinite(lses[:, i]).any():
          w = np.exp(lses[:, i] - lses[:, i].max())
          out[bi, i, hi] = (w / w.sum()) @ outs[:, i]
  return out


def np_shared_qk_softmax(q, v, causal=False, key_padding=None):
  """softmax over keys j != i (self only when it is the sole key) of q_i . k_j / sqrt(d)."""
  q, v = np.asarray(q, np.float64), np.asarray(v, np.float64)
  b, n, h, d = q.shape
  real = np.ones((b, n), bool) if key_padding is None else np.asarray(key_padding, bool)
  out = np.zeros((b, n, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      s = q[bi, :, hi] @ _keys(q[bi, :, hi]).T / np.sqrt(d)
      for i in range(n):
        allowed = real[bi] & ((np.arange(n) <= i) if causal else True)
        others = allowed & (np.arange(n) != i)
        keep = others if others.any() else allowed
        if keep.any():
          w = np.exp(s[i, keep] - s[i, keep].max())
          out[bi, i, hi] = (w / w.sum()) @ v[bi, keep, hi]
  return out


@pytest.mark.parametrize('causal', [False, True])
def test_one_bucket_one_chunk_is_shared_qk_softmax(x64, causal):
  rng = np.random.default_rng(0)
  q, v = _qv(rng, n=10)
  n_hashes, mask, chunk_size = (2, PAD, 64) if causal else (1, None, 10)
  got = _run(
    q, None, v, mask=mask, causal=causal, n_buckets=1, n_hashes=n_hashes, chunk_size=chunk_size
  )
  assert got.dtype == jnp.float64
  real = np.ones(q.shape[:2], bool) if mask is None else mask  # padded queries: no meaning
  np.testing.assert_allclose(
    np.asarray(got)[real], np_shared_qk_softmax(q, v, causal, mask)[real], rtol=1e-10, atol=1e-12
  )


@pytest.mark.parametrize(
  'causal, n, chunk, mask, seed',
  [(False, 16, 4, None, 0), (True, 16, 4, None, 1), (False, 10, 2, PAD, 2), (True, 10, 2, PAD, 3)],
)
def test_matches_numpy_reference(x64, causal, n, chunk, mask, seed):
  rng = np.random.default_rng(seed)
  q, v = _qv(rng, n=n)
  kwargs = dict(n_buckets=4, n_hashes=2, chunk_size=chunk, seed=seed, causal=causal, scale=0.8)
  got = _run(q, q, v, mask=mask, **kwargs)
  np.testing.assert_allclose(
    np.asarray(got), np_reformer(q, v, key_padding=mask, **kwargs), rtol=1e-10, atol=1e-12
  )


def test_hashing_is_not_trivial():
  """The reference tests are not vacuous: tokens spread over buckets; seeds matter."""
  rng = np.random.default_rng(2)
  q, v = (jnp.asarray(x, jnp.float32) for x in _qv(rng))
  buckets = np.asarray(reformer.lsh_buckets(q, lsh_rotations(0, H, D, 4, 2)))
  assert buckets.shape == (2, H, 2, 16) and len(np.unique(buckets)) == 4
  assert np.any(buckets[:, :, 0] != buckets[:, :, 1])  # the rounds hash differently
  assert not np.array_equal(buckets, reformer.lsh_buckets(q, lsh_rotations(1, H, D, 4, 2)))


def test_no_lookahead():
  """One chunk (sorted, so causality must follow positions, not sorted order) and four."""
  rng = np.random.default_rng(3)
  q, v = (jnp.asarray(x, jnp.float32) for x in _qv(rng))

  def fn(q, k, v):
    return jnp.concatenate(
      [
        reformer_attention(q, k, v, causal=True, n_buckets=4, n_hashes=2, chunk_size=chunk)
        for chunk in (16, 4)
      ],
      axis=-1,
    )

  assert_no_lookahead(fn, (q, jnp.zeros_like(q), v), past_args=(0, 2))


def test_padded_tokens_do_not_matter():
  """Keys are the queries: changing q, k, v at padded positions moves no real output."""
  rng = np.random.default_rng(4)
  q, v = _qv(rng, n=10, dtype=np.float32)
  q2, v2 = q.copy(), v.copy()
  q2[~PAD] = 1e3 * rng.normal(size=q2[~PAD].shape)
  v2[~PAD] = 1e3 * rng.normal(size=v2[~PAD].shape)
  flax_mask = PAD[:, None, :, None] & PAD[:, None, None, :]  # reduced to key padding PAD
  run = jax.jit(
    lambda q, v: [
      reformer_attention(
        q, q, v, mask=flax_mask, causal=causal, n_buckets=4, n_hashes=2, chunk_size=2
      )
      for causal in (False, True)
    ]
  )
  for out1, out2 in zip(run(q, v), run(q2, v2)):
    np.testing.assert_allclose(np.asarray(out1)[PAD], np.asarray(out2)[PAD], rtol=1e-6, atol=1e-6)


def test_bf16_finite_outputs_and_grads():
  rng = np.random.default_rng(5)
  q, v = (jnp.asarray(4 * x, jnp.bfloat16) for x in _qv(rng, n=10))

  def fn(q, k, v):
    return reformer_attention(q, k, v, mask=PAD, causal=True, n_buckets=4, chunk_size=2)

  out, grads = value_and_grads(fn)(q, q, v)
  assert out.dtype == jnp.bfloat16 and out.shape == (2, 10, H, DV)
  for x in (out, grads[0], grads[2]):
    assert np.all(np.isfinite(np.asarray(x, np.float32)))
    assert np.any(np.asarray(x, np.float32) != 0)
  assert not np.any(np.asarray(grads[1], np.float32))  # k is ignored


def test_param_specs_and_errors():
  assert reformer.param_specs(heads=2, head_dim=4, max_length=16, n_buckets=8) == {}
  rng = np.random.default_rng(6)
  q, v = (jnp.asarray(x, jnp.float32) for x in _qv(rng, n=12))
  with pytest.raises(ValueError, match='n_buckets must be 1 or an even number >= 2, got 3'):
    reformer_attention(q, None, v, n_buckets=3, chunk_size=4)
  with pytest.raises(
    ValueError, match=r'reformer_attention: n_hashes=0 is not valid; it must be an int >= 1$'
  ):
    reformer_attention(q, None, v, n_hashes=0, chunk_size=4)
  with pytest.raises(ValueError, match='length 12 is not divisible by chunk_size=8'):
    reformer_attention(q, None, v, chunk_size=8)
  with pytest.raises(ValueError, match=r'chunk_size=0 is not valid; it must be an int >= 1$'):
    reformer_attention(q, None, v, chunk_size=0)
  with pytest.raises(ValueError, match='self-attention'):
    reformer_attention(q, None, v[:, :8], chunk_size=4)

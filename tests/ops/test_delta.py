"""The (gated) delta rule's chunkwise (WY) form and decoding step equal its float64 definition
(efficient_attn.ops.delta): lengths that are and are not multiples of the chunk, with a decay
per head and without, and 8K tokens of strong decay and of none."""

import functools

import gated_helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.ops import delta
from efficient_attn.ops.gated.reference import zero_state


def _delta_inputs(n, seed=0, gated=True, strength=1.0, b=1, h=2, dk=3, dv=2):
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((b, n, h, dk)) for _ in range(2))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the mechanisms' L2-normalised keys
  v = rng.standard_normal((b, n, h, dv))
  beta = rng.uniform(0.0, 1.0, (b, n, h))
  g = -strength * rng.uniform(0.0, 1.0, (b, n, h, 1)) if gated else None
  return q, k, v, g, beta


def _delta_reference(q, k, v, g, beta):
  if g is None:
    return gated_helpers.per_head(gated_helpers.delta_recurrence, q, k, v, beta)
  return gated_helpers.per_head(gated_helpers.delta_recurrence, q, k, v, beta, g)


@pytest.mark.parametrize('gated', [False, True])  # DeltaNet; Gated DeltaNet
@pytest.mark.parametrize('n', [12, 13])
def test_delta_rule_forms_equal_the_recurrence(gated, n):
  q, k, v, g, beta = _delta_inputs(n, gated=gated)
  want = _delta_reference(q, k, v, g, beta)
  f32 = lambda a: None if a is None else np.asarray(a, np.float32)
  args = [f32(a) for a in (q, k, v, g, beta)]
  argnums = (0, 1, 2, 3, 4) if gated else (0, 1, 2, 4)
  loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a)[0]))

  @jax.jit  # one compiled program (eagerly, every operation would compile alone)
  def forms(*a):
    return (
      delta.delta_chunked(*a, chunk_size=4),
      delta.delta_scan(*a),
      jax.grad(loss(lambda *a: delta.delta_chunked(*a, chunk_size=4)), argnums=argnums)(*a),
    )

  (chunk, s_chunk), (naive, s_naive), grads = forms(*args)
  np.testing.assert_allclose(chunk, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(naive, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(s_chunk, s_naive, atol=1e-5, rtol=1e-5)
  step = jax.jit(delta.delta_step)  # one compiled step, reused at every token
  s, outs = zero_state(1, 2, 3, 2), []
  for t in range(n):
    s, out_t = step(s, *(None if a is None else a[:, t] for a in args))
    outs.append(out_t)
  np.testing.assert_allclose(np.stack(outs, 1), want, atol=1e-5, rtol=1e-5)
  with jax.enable_x64(True):
    want_grads = jax.jit(jax.grad(loss(delta.delta_scan), argnums=argnums))(
      *(None if a is None else jnp.asarray(a, jnp.float64) for a in (q, k, v, g, beta))
    )
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('strength', [None, 30.0])  # DeltaNet (no decay); strong decay
def test_delta_rule_8k_tokens_are_finite_and_exact(strength):
  n = 8192
  q, k, v, g, beta = _delta_inputs(
    n, seed=1, gated=strength is not None, strength=strength or 0.0, h=1, dk=2, dv=2
  )
  want = _delta_reference(q, k, v, g, beta)
  got, _ = jax.jit(lambda *a: delta.delta_chunked(*a, chunk_size=64))(
    *(None if a is None else jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta))
  )
  assert np.all(np.isfinite(np.asarray(got)))
  np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=1e-4)


# Kimi Delta Attention (Kimi Team 2025): the decay per key feature,
# S_t = (I - beta_t k_t k_t^T) diag(a_t) S_{t-1} + beta_t k_t v_t^T.
KDA_IDS = np.array([[1] * 5 + [2] * 30 + [0] * 3 + [3] * 32, [4] * 40 + [0] * 2 + [5] * 28])


def _kda_recurrence(q, k, v, g, beta, s):
  """NumPy float64, one (batch, head): q, k `[n, dk]`, v `[n, dv]`, g `[n, dk]`, beta `[n]`,
  s `[dk, dv]` -> (o `[n, dv]`, final S)."""
  out = []
  for t in range(q.shape[0]):
    s = np.exp(g[t])[:, None] * s
    s = s + beta[t] * np.outer(k[t], v[t] - s.T @ k[t])
    out.append(s.T @ q[t])
  return np.stack(out), s


def test_the_per_feature_step_is_kimi_delta_attention():
  """delta_scan with log-decays `[b, n, h, dk]` is KDA's recurrence (fla's
  `naive_recurrent_kda`), written here in NumPy: the chunk form's reference below."""
  q, k, v, g, beta = _delta_inputs(9, dk=3, dv=2, b=1, h=1)
  g = np.random.default_rng(5).uniform(-1.0, 0.0, (1, 9, 1, 3))
  s0 = np.random.default_rng(6).standard_normal((1, 1, 3, 2))
  want, s_want = _kda_recurrence(
    q[0, :, 0], k[0, :, 0], v[0, :, 0], g[0, :, 0], beta[0, :, 0], s0[0, 0]
  )
  with jax.enable_x64(True):
    got, s_got = jax.jit(delta.delta_scan)(q, k, v, g, beta, initial_state=s0)
  np.testing.assert_allclose(got[0, :, 0], want, atol=1e-12)
  np.testing.assert_allclose(s_got[0, 0], s_want, atol=1e-12)


@pytest.mark.parametrize('chunk', [4, 32])  # one sub-chunk a chunk; two of 16 (secondary)
def test_a_per_feature_decay_chunkwise_equals_the_recurrence_in_float64(chunk):
  """The WY form with a decay per key feature (KDA) equals the token recurrence in float64:
  several chunks (70 tokens, the last chunk partial), packed rows that cross chunk
  boundaries, an initial state; outputs, final state and the gradients of every input."""
  b, n, h, dk, dv = 2, 70, 2, 4, 3
  q, k, v, _, beta = _delta_inputs(n, seed=2, b=b, h=h, dk=dk, dv=dv)
  rng = np.random.default_rng(3)
  g = -rng.uniform(0.0, 1.0, (b, n, h, dk)) * rng.uniform(0.0, 3.0, (1, 1, h, dk))
  s0 = rng.standard_normal((b, h, dk, dv))
  args = (q, k, v, g, beta, s0)
  loss = lambda fn: (
    lambda *a: sum(jnp.sum(jnp.sin(x)) for x in fn(*a[:5], initial_state=a[5], segment_ids=KDA_IDS))
  )
  with jax.enable_x64(True):
    f64 = tuple(jnp.asarray(x, jnp.float64) for x in args)
    chunked = functools.partial(delta.delta_chunked, chunk_size=chunk)
    run = lambda fn: jax.jit(
      lambda *a: (
        fn(*a[:5], initial_state=a[5], segment_ids=KDA_IDS),
        jax.grad(loss(fn), argnums=tuple(range(6)))(*a),
      )
    )
    got, grads = run(chunked)(*f64)
    want, want_grads = run(delta.delta_scan)(*f64)
  for x, w in zip(got + grads, want + want_grads):
    np.testing.assert_allclose(x, w, atol=1e-10, rtol=1e-10)


def test_a_per_feature_decay_8k_tokens_are_finite_and_exact():
  """8K tokens of a strong per-feature decay (log a down to -30 a token) in float32: every
  decay factor the chunk form makes is <= 1, so nothing overflows."""
  n = 8192
  q, k, v, _, beta = _delta_inputs(n, seed=4, h=1, dk=2, dv=2)
  g = -30.0 * np.random.default_rng(4).uniform(0.0, 1.0, (1, n, 1, 2))
  want = _kda_recurrence(q[0, :, 0], k[0, :, 0], v[0, :, 0], g[0, :, 0], beta[0, :, 0], 0.0)[0]
  f32 = tuple(jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta))
  got, _ = jax.jit(lambda *a: delta.delta_chunked(*a, chunk_size=64))(*f32)
  assert np.all(np.isfinite(np.asarray(got)))
  np.testing.assert_allclose(got[0, :, 0], want, atol=2e-5 * np.abs(want).max(), rtol=1e-4)


def test_a_decay_of_another_width_is_refused_in_one_line():
  q, k, v, _, beta = (jnp.asarray(a, jnp.float32) for a in _delta_inputs(4, dk=3))
  with pytest.raises(ValueError, match=r'log-decays of shape \(1, 4, 2, 2\); valid') as e:
    delta.delta_chunked(q, k, v, jnp.zeros((1, 4, 2, 2)), beta)
  assert '\n' not in str(e.value)


def test_a_per_feature_decay_in_bfloat16_stays_within_a_stated_tolerance():
  """bfloat16 q, k, v (96 tokens, chunks of 32 in two sub-chunks, decays down to -3 a token)
  against the float64 recurrence on the same rounded inputs: the matmuls take bfloat16
  operands, the decays, their cumulative sums, beta, the state and the triangular inverse
  stay float32, so outputs, final state and gradients stay within 1e-2 of their scale
  (measured 3e-3 to 6e-3: each rounded operand costs up to 2^-9); cumulative sums rounded to
  bfloat16 would not (4e-2)."""
  b, n, h, dk, dv = 1, 96, 2, 16, 16
  q, k, v, _, beta = _delta_inputs(n, seed=7, b=b, h=h, dk=dk, dv=dv)
  g = -3.0 * np.random.default_rng(7).uniform(0.0, 1.0, (b, n, h, dk))
  bf16 = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)]
  rest = [jnp.asarray(x, jnp.float32) for x in (g, beta)]
  cotangent = np.random.default_rng(8).standard_normal((b, n, h, dv))

  def run(fn, *a):
    loss = lambda *a: jnp.sum(fn(*a)[0].astype(jnp.float32) * cotangent) + jnp.sum(fn(*a)[1])
    return fn(*a) + jax.grad(loss, argnums=(0, 1, 2, 3))(*a)

  got = jax.jit(functools.partial(run, functools.partial(delta.delta_chunked, chunk_size=32)))(
    *bf16, *rest
  )
  with jax.enable_x64(True):
    want = jax.jit(functools.partial(run, delta.delta_scan))(
      *(jnp.asarray(x, jnp.float64) for x in bf16 + rest)
    )
  for x, w in zip(got, want):
    x, w = np.asarray(x, np.float64), np.asarray(w)
    error = np.max(np.abs(x - w)) / np.max(np.abs(w))
    assert np.all(np.isfinite(x)) and error < 1e-2, error

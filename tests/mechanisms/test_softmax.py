"""softmax and softmax_chunked (FlashAttention's blocks, hand-written backward) against references.

Values against the float64 NumPy reference; gradients against autodiff of the
dense einsum in float64, for causal self- and cross-attention, key padding
with a fully masked row, per-head masks and chunks that do not divide the lengths.
"""

import jax
import jax.numpy as jnp
import numpy as np
from pattern_reference import np_masked_attention
import pytest

from efficient_attn.mechanisms.softmax import chunked_softmax_attention
from efficient_attn.mechanisms.softmax import softmax_attention
from efficient_attn.ops.scaled_dot_product import masked_softmax
from efficient_attn.ops.scaled_dot_product import softmax_last


def _inputs(lq, lk, seed=0, b=2, h=2, d=4):
  rng = np.random.default_rng(seed)
  return (
    rng.normal(size=(b, lq, h, d)),
    rng.normal(size=(b, lk, h, d)),
    rng.normal(size=(b, lk, h, 3)),
  )


def _mask(kind, b, h, lq, lk, seed=1):
  if kind is None:
    return None
  if kind == 'keys':
    m = np.ones((b, lk), bool)
    m[0, lk // 2 :] = False
    m[1] = False  # row 1 sees no key: output and gradients 0
    return m
  return np.random.default_rng(seed).random((b, h, lq, lk)) < 0.7  # per head and query


CASES = [  # lq, lk, causal, mask, q_chunk, k_chunk
  (16, 16, False, None, 8, 4),
  (13, 13, True, None, 4, 5),  # chunks do not divide the length
  (7, 19, True, None, 3, 4),  # causal aligned at the end, fewer queries
  (19, 7, True, 'keys', 4, 3),  # more queries than keys: early rows see nothing
  (9, 5, True, None, 4, 2),  # the same without a mask
  (12, 17, False, 'keys', 5, 6),
  (12, 12, True, 'per_head', 4, 4),
]


@pytest.mark.parametrize('lq, lk, causal, mask, cq, ck', CASES)
def test_values_and_gradients_equal_dense_attention(lq, lk, causal, mask, cq, ck, x64):
  del x64
  q, k, v = _inputs(lq, lk)
  m = _mask(mask, 2, 2, lq, lk)
  allowed = np.ones((lq, lk), bool)
  if causal:
    allowed = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)
  if m is not None and m.ndim == 4:
    allowed, key_padding = allowed & m, None
  else:
    key_padding = m
  want = np_masked_attention(q, k, v, allowed, key_padding=key_padding) if lq == lk else None
  if want is None:  # np_masked_attention is square; write the rectangular case out
    s = np.einsum('bqhd,bkhd->bhqk', q, k) / 2.0
    ok = np.broadcast_to(allowed, s.shape) & (True if m is None else m[:, None, None, :])
    e = np.where(ok, np.exp(s - np.where(ok, s, -np.inf).max(-1, keepdims=True)), 0.0)
    z = e.sum(-1, keepdims=True)
    want = np.einsum('bhqk,bkhd->bqhd', np.where(z > 0, e / np.where(z > 0, z, 1), 0.0), v)
  w = np.random.default_rng(2).normal(size=want.shape)

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

  flash_fn = lambda q, k, v: chunked_softmax_attention(q, k, v, m, causal, q_chunk=cq, k_chunk=ck)
  dense_fn = lambda q, k, v: softmax_attention(q, k, v, m, causal)

  @jax.jit  # one compiled program (eagerly, every operation would compile alone)
  def run(q, k, v):
    return (
      flash_fn(q, k, v),
      dense_fn(q, k, v),
      jax.grad(loss(flash_fn), argnums=(0, 1, 2))(q, k, v),
      jax.grad(loss(dense_fn), argnums=(0, 1, 2))(q, k, v),
    )

  got, dense_out, flash, dense = run(q, k, v)
  np.testing.assert_allclose(got, want, atol=1e-10)
  np.testing.assert_allclose(dense_out, want, atol=1e-10)
  for a, b in zip(flash, dense):
    np.testing.assert_allclose(a, b, atol=1e-10)


def test_softmax_last_and_masked_softmax_derivatives_equal_the_plain_forms(x64):
  """The einsum-written derivatives (softmax_last's jvp, masked_softmax's e / z) against
  jax.nn.softmax and the broadcast division, forward and reverse, with a fully masked row."""
  del x64
  rng = np.random.default_rng(3)
  x, dx, ct = (jnp.asarray(rng.normal(size=(2, 3, 5))) for _ in range(3))
  valid = np.ones((2, 3, 5), bool)
  valid[0, 1, 2:] = False
  valid[1, 2] = False  # a row with no valid entry

  def plain_masked(s):
    e = jnp.where(valid, jnp.exp(s - jax.lax.stop_gradient(s.max(-1, keepdims=True))), 0.0)
    z = e.sum(-1, keepdims=True)
    return e / jnp.where(z > 0, z, 1.0)

  pairs = [
    (softmax_last, lambda s: jax.nn.softmax(s, axis=-1)),
    (lambda s: masked_softmax(s, valid)[0], plain_masked),
  ]

  @jax.jit  # one compiled program (eagerly, every operation would compile alone)
  def derivatives(x, dx, ct):
    return [
      [jax.jvp(f, (x,), (dx,)) + (jax.vjp(f, x)[1](ct)[0],) for f in pair] for pair in pairs
    ] + [jax.grad(lambda s: masked_softmax(s, valid)[0].sum())(x)]

  *by_pair, grad = derivatives(x, dx, ct)
  for (new_out, new_jvp, new_vjp), (plain_out, plain_jvp, plain_vjp) in by_pair:
    for got, want in zip((new_out, new_jvp), (plain_out, plain_jvp)):
      np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(new_vjp, plain_vjp, atol=1e-12)
  np.testing.assert_array_equal(grad[1, 2], 0)


def test_bfloat16_inputs_give_finite_close_values_and_gradients():
  q, k, v = (jnp.asarray(x * 8, jnp.bfloat16) for x in _inputs(32, 32))  # large scores
  fn = lambda f: lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) ** 2)
  flash = jax.jit(
    jax.value_and_grad(
      fn(lambda q, k, v: chunked_softmax_attention(q, k, v, causal=True, q_chunk=8, k_chunk=8)),
      argnums=(0, 1, 2),
    )
  )(q, k, v)
  dense = jax.jit(
    jax.value_and_grad(
      fn(lambda q, k, v: softmax_attention(q, k, v, causal=True)), argnums=(0, 1, 2)
    )
  )(q, k, v)
  for a, b in zip(jax.tree_util.tree_leaves(flash), jax.tree_util.tree_leaves(dense)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, atol=0.02 * max(1.0, np.abs(b).max()))


def test_memory_stays_linear_in_length():
  """XLA's own memory analysis of forward + backward: doubling n roughly doubles it."""

  def peak(n):
    q = jnp.zeros((1, n, 2, 16))
    grad = jax.grad(
      lambda q: chunked_softmax_attention(q, q, q, causal=True, q_chunk=64, k_chunk=64).sum()
    )
    stats = jax.jit(grad).lower(q).compile().memory_analysis()
    return stats.temp_size_in_bytes + stats.argument_size_in_bytes

  small, large = peak(1024), peak(2048)  # each program compiled once
  assert large < 2.5 * small
  assert large < 2048 * 2048 * 4  # far below one n x n float32 array

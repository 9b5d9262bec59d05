"""Tests of efficient_attn.mechanisms.sparse against a dense float64 NumPy reference."""

import functools

from helpers import assert_no_lookahead
import jax
import numpy as np
from pattern_reference import check_padding_and_bfloat16
from pattern_reference import flax_mask
from pattern_reference import inputs
from pattern_reference import largest_array
from pattern_reference import np_masked_attention
from pattern_reference import padding
import pytest

from efficient_attn.mechanisms import sparse
from efficient_attn.mechanisms.softmax import softmax_attention

sparse_attention = jax.jit(
  sparse.sparse_attention, static_argnames=('causal', 'pattern', 'stride', 'num_summary', 'scale')
)
softmax = jax.jit(softmax_attention, static_argnames=('causal',))


def np_sparse_pattern(n, pattern, stride, num_summary, causal):
  """Bool `[n, n]`: the union of the two sub-patterns of Child et al. (2019)."""
  i, j = np.arange(n)[:, None], np.arange(n)[None, :]
  if pattern == 'strided':
    union = (np.abs(i - j) < stride) | ((i - j) % stride == 0)
  else:
    union = (i // stride == j // stride) | (j % stride >= stride - num_summary)
  return union & (j <= i) if causal else union


def np_sparse(
  q, k, v, mask=None, causal=False, pattern='strided', stride=4, num_summary=1, scale=None
):
  allowed = np_sparse_pattern(q.shape[1], pattern, stride, num_summary, causal)
  return np_masked_attention(q, k, v, allowed, mask, scale=scale)


def test_reference_pattern_examples():
  """The reference pattern itself, spelled out for n = 8, stride 3."""
  strided = np_sparse_pattern(8, 'strided', 3, 1, causal=True)
  assert list(np.flatnonzero(strided[7])) == [1, 4, 5, 6, 7]
  assert list(np.flatnonzero(np_sparse_pattern(8, 'strided', 3, 1, False)[2])) == [0, 1, 2, 3, 4, 5]
  fixed = np_sparse_pattern(8, 'fixed', 3, 1, causal=True)
  assert list(np.flatnonzero(fixed[7])) == [2, 5, 6, 7]
  assert list(np.flatnonzero(np_sparse_pattern(8, 'fixed', 3, 2, False)[0])) == [0, 1, 2, 4, 5, 7]


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize(
  'pattern, n, stride, num_summary', [('strided', 15, 4, 1), ('fixed', 14, 4, 2)]
)
def test_matches_dense_reference(x64, causal, pattern, n, stride, num_summary):
  """Under jax.jit; key padding none (all True) or padding(n), given as `[b, n]`
  (non-causal) or as a flax-style `[b, 1, n, n]` mask (causal). 15 and 14 are
  not multiples of the stride (the no-look-ahead test's 12 is)."""
  q, k, v = inputs(n=n)
  options = dict(causal=causal, pattern=pattern, stride=stride, num_summary=num_summary, scale=0.7)
  for mask in (np.ones((2, n), bool), padding(n)):
    got = sparse_attention(q, k, v, flax_mask(mask) if causal else mask, **options)
    assert got.dtype == np.float64 and got.shape == v.shape
    np.testing.assert_allclose(
      np.asarray(got), np_sparse(q, k, v, mask, **options), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize('causal, pattern, stride', [(False, 'strided', 1), (True, 'fixed', 12)])
def test_full_pattern_equals_softmax(x64, causal, pattern, stride):
  """Stride 1 ('strided') or one block of every position ('fixed'): softmax."""
  q, k, v = inputs(n=10)
  got = sparse_attention(q, k, v, causal=causal, pattern=pattern, stride=stride)
  want = softmax(q, k, v, causal=causal)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize('pattern', ['strided', 'fixed'])
def test_no_lookahead(pattern):
  q, k, v = inputs(b=1, n=12, dtype=np.float32)
  fn = functools.partial(sparse.sparse_attention, causal=True, pattern=pattern, stride=3)
  assert_no_lookahead(fn, (q, k, v))


@pytest.mark.parametrize('causal, pattern', [(False, 'strided'), (True, 'fixed')])
def test_padding_and_bfloat16(causal, pattern):
  """Two of the four forms (each form's key padding is also in the float64 test)."""
  options = dict(causal=causal, pattern=pattern, stride=4, num_summary=1)
  check_padding_and_bfloat16(
    functools.partial(sparse.sparse_attention, **options),
    22,
    functools.partial(np_sparse, **options),
  )


@pytest.mark.parametrize('pattern', ['strided', 'fixed'])
def test_never_forms_the_n_by_n_matrix(pattern):
  n = 512
  fn = functools.partial(sparse.sparse_attention, pattern=pattern, stride=16)
  assert largest_array(fn, n) * 4 <= n * n


def test_errors():
  q, k, v = inputs(b=1, n=8, h=1)
  with pytest.raises(ValueError, match='pattern'):
    sparse.sparse_attention(q, k, v, pattern='dense')
  with pytest.raises(ValueError, match='stride'):
    sparse.sparse_attention(q, k, v, stride=0)
  with pytest.raises(ValueError, match='num_summary'):
    sparse.sparse_attention(q, k, v, pattern='fixed', stride=4, num_summary=5)
  with pytest.raises(ValueError, match='num_summary'):
    sparse.sparse_attention(q, k, v, pattern='fixed', stride=4, num_summary=0)
  with pytest.raises(ValueError, match='q_length == kv_length'):
    sparse.sparse_attention(q[:, :4], k, v)

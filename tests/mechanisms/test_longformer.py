"""Tests of efficient_attn.mechanisms.longformer against a dense float64 NumPy reference."""

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

from efficient_attn.mechanisms import local
from efficient_attn.mechanisms import longformer
from efficient_attn.mechanisms.softmax import softmax_attention

longformer_attention = jax.jit(
  longformer.longformer_attention, static_argnames=('causal', 'window', 'global_tokens', 'scale')
)
softmax = jax.jit(softmax_attention, static_argnames=('causal',))


def np_longformer_pattern(n, window, global_tokens, causal):
  """Bool `[n, n]`: local_attention's band, plus global keys and global queries."""
  i, j = np.arange(n)[:, None], np.arange(n)[None, :]
  band = ((j <= i) & (j > i - window)) if causal else np.abs(i - j) <= window // 2
  pattern = band | (j < global_tokens) | (i < global_tokens)
  return pattern & (j <= i) if causal else pattern


def np_longformer(q, k, v, mask=None, causal=False, window=4, global_tokens=1, scale=None):
  pattern = np_longformer_pattern(q.shape[1], window, global_tokens, causal)
  return np_masked_attention(q, k, v, pattern, mask, scale=scale)


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('n, window, g', [(16, 4, 1), (13, 5, 3)])
def test_matches_dense_reference(x64, causal, n, window, g):
  """Under jax.jit; key padding none (all True) or padding(n), given as `[b, n]`
  (non-causal) or as a flax-style `[b, 1, n, n]` mask (causal)."""
  q, k, v = inputs(n=n)
  options = dict(causal=causal, window=window, global_tokens=g, scale=0.7)
  for mask in (np.ones((2, n), bool), padding(n)):
    got = longformer_attention(q, k, v, flax_mask(mask) if causal else mask, **options)
    assert got.dtype == np.float64 and got.shape == v.shape
    np.testing.assert_allclose(
      np.asarray(got), np_longformer(q, k, v, mask, **options), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize('causal, g', [(False, 10), (True, 15)])
def test_all_global_equals_softmax(x64, causal, g):
  """global_tokens >= n (= n, or above n): exact softmax attention."""
  q, k, v = inputs(n=10)
  got = longformer_attention(q, k, v, causal=causal, window=2, global_tokens=g)
  want = softmax(q, k, v, causal=causal)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)


def test_no_global_tokens_is_local_attention(x64):
  q, k, v = inputs(n=12)
  got = longformer_attention(q, k, v, padding(12), causal=True, window=4, global_tokens=0)
  want = jax.jit(local.local_attention, static_argnames=('window', 'causal'))(
    q, k, v, window=4, mask=padding(12), causal=True
  )
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)


def test_no_lookahead():
  q, k, v = inputs(b=1, n=12, dtype=np.float32)
  fn = functools.partial(longformer.longformer_attention, causal=True, window=3, global_tokens=2)
  assert_no_lookahead(fn, (q, k, v))


@pytest.mark.parametrize('causal', [False, True])
def test_padding_and_bfloat16(causal):
  options = dict(causal=causal, window=4, global_tokens=2)
  check_padding_and_bfloat16(
    functools.partial(longformer.longformer_attention, **options),
    20,
    functools.partial(np_longformer, **options),
  )


def test_never_forms_the_n_by_n_matrix():
  n = 512
  fn = functools.partial(longformer.longformer_attention, causal=False, window=32, global_tokens=2)
  assert largest_array(fn, n) * 4 <= n * n


def test_errors():
  q, k, v = inputs(b=1, n=8, h=1)
  with pytest.raises(ValueError, match='window'):
    longformer.longformer_attention(q, k, v, window=0)
  with pytest.raises(ValueError, match='global_tokens'):
    longformer.longformer_attention(q, k, v, global_tokens=-1)
  with pytest.raises(ValueError, match='q_length == kv_length'):
    longformer.longformer_attention(q[:, :4], k, v)

"""Tests of efficient_attn.mechanisms.bigbird against a dense float64 NumPy reference."""

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

from efficient_attn.mechanisms import bigbird
from efficient_attn.mechanisms.softmax import softmax_attention

OPTIONS = ('causal', 'block_size', 'num_global_blocks', 'num_random_blocks', 'seed', 'scale')
bigbird_attention = jax.jit(bigbird.bigbird_attention, static_argnames=OPTIONS)
softmax = jax.jit(softmax_attention, static_argnames=('causal',))


def np_bigbird_pattern(layout, block, causal):
  """Token pattern `[1, heads, n, n]` of a block layout `[heads, nb, nb]`."""
  pattern = np.repeat(np.repeat(layout, block, axis=1), block, axis=2)
  if causal:
    pattern = pattern & np.tril(np.ones(pattern.shape[1:], bool))
  return pattern[None]


# ---------------------------------------------------------------------------
# The block layout.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('causal', [False, True])
def test_layout_structure(causal):
  nb, heads, g, r = 10, 3, 2, 2
  layout = bigbird.bigbird_layout(nb, heads, g, r, seed=3, causal=causal)
  assert layout.shape == (heads, nb, nb) and layout.dtype == bool
  for c in range(nb):
    past = np.arange(nb) <= c if causal else np.ones(nb, bool)
    for head in range(heads):
      row = layout[head, c]
      if c < g:  # a global query block sees every (past) block
        np.testing.assert_array_equal(row, past)
        continue
      sliding = [m for m in (c - 1, c, c + 1) if 0 <= m < nb and (m <= c or not causal)]
      covered = set(range(g)) | set(sliding)
      assert all(row[m] for m in covered)
      extra = set(np.flatnonzero(row)) - covered
      candidates = [m for m in range(nb) if m not in covered and past[m]]
      assert len(extra) == min(r, len(candidates))
      assert extra <= set(candidates)  # random blocks: uncovered, and past if causal


def test_layout_is_seeded_and_per_head():
  a = bigbird.bigbird_layout(16, 4, 1, 2, seed=0)
  np.testing.assert_array_equal(a, bigbird.bigbird_layout(16, 4, 1, 2, seed=0))
  assert not np.array_equal(a, bigbird.bigbird_layout(16, 4, 1, 2, seed=1))
  assert any(not np.array_equal(a[0], a[i]) for i in range(1, 4))


@pytest.mark.parametrize('causal', [False, True])
def test_layout_degenerates_to_full(causal):
  nb = 6  # G + 3 + R = 1 + 3 + 3 > 6
  layout = bigbird.bigbird_layout(nb, 2, 1, 3, causal=causal)
  full = np.tril(np.ones((nb, nb), bool)) if causal else np.ones((nb, nb), bool)
  np.testing.assert_array_equal(layout, np.broadcast_to(full, layout.shape))


# ---------------------------------------------------------------------------
# Against the reference.
# ---------------------------------------------------------------------------


def np_bigbird(
  q,
  k,
  v,
  mask=None,
  causal=False,
  block_size=4,
  num_global_blocks=1,
  num_random_blocks=1,
  seed=0,
  scale=None,
):
  """Float64 BigBird: the explicit token pattern of the layout, masked softmax."""
  layout = bigbird.bigbird_layout(
    q.shape[1] // block_size, q.shape[2], num_global_blocks, num_random_blocks, seed, causal
  )
  pattern = np_bigbird_pattern(layout, block_size, causal)
  return np_masked_attention(q, k, v, pattern, mask, scale=scale)


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('n, block, g, r, seed', [(32, 2, 2, 2, 5), (24, 4, 0, 1, 0)])
def test_matches_dense_reference(x64, causal, n, block, g, r, seed):
  """Under jax.jit; key padding none (all True) or padding(n), given as `[b, n]`
  (non-causal) or as a flax-style `[b, 1, n, n]` mask (causal)."""
  q, k, v = inputs(n=n)
  options = dict(
    causal=causal, block_size=block, num_global_blocks=g, num_random_blocks=r, seed=seed, scale=0.7
  )
  for mask in (np.ones((2, n), bool), padding(n)):
    got = bigbird_attention(q, k, v, flax_mask(mask) if causal else mask, **options)
    assert got.dtype == np.float64 and got.shape == v.shape
    np.testing.assert_allclose(
      np.asarray(got), np_bigbird(q, k, v, mask, **options), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize('causal, g, r', [(False, 4, 1), (True, 4, 0), (True, 1, 3)])
def test_full_pattern_equals_softmax(x64, causal, g, r):
  """Every block global (g = nb), or G + 3 + R > nb: exact softmax attention."""
  q, k, v = inputs(n=16)
  got = bigbird_attention(
    q, k, v, causal=causal, block_size=4, num_global_blocks=g, num_random_blocks=r
  )
  want = softmax(q, k, v, causal=causal)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------
# Structure and numerics.
# ---------------------------------------------------------------------------


def test_no_lookahead():
  q, k, v = inputs(b=1, n=16, dtype=np.float32)
  fn = functools.partial(
    bigbird.bigbird_attention, causal=True, block_size=2, num_global_blocks=1, num_random_blocks=2
  )
  assert_no_lookahead(fn, (q, k, v))


@pytest.mark.parametrize('causal', [False, True])
def test_padding_and_bfloat16(causal):
  options = dict(causal=causal, block_size=4, num_global_blocks=1, num_random_blocks=1)
  check_padding_and_bfloat16(
    functools.partial(bigbird.bigbird_attention, **options),
    32,
    functools.partial(np_bigbird, **options),
  )


def test_never_forms_the_n_by_n_matrix():
  n = 512
  fn = functools.partial(bigbird.bigbird_attention, causal=True, block_size=16)
  assert largest_array(fn, n) * 4 <= n * n


def test_errors():
  q, k, v = inputs(b=1, n=12, h=1)
  with pytest.raises(ValueError, match='length 12 is not divisible by block_size 5'):
    bigbird.bigbird_attention(q, k, v, block_size=5)
  with pytest.raises(ValueError, match='block_size'):
    bigbird.bigbird_attention(q, k, v, block_size=0)
  with pytest.raises(ValueError, match=r'num_global_blocks must be in \[0, 3\]'):
    bigbird.bigbird_attention(q, k, v, block_size=4, num_global_blocks=4)
  with pytest.raises(ValueError, match='num_random_blocks'):
    bigbird.bigbird_attention(q, k, v, block_size=4, num_random_blocks=-1)
  with pytest.raises(ValueError, match='q_length == kv_length'):
    bigbird.bigbird_attention(q[:, :8], k, v, block_size=4)

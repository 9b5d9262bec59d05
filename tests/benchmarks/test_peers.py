"""The peers benchmark: each published algorithm checked against an identity, then one tiny run."""

import os

import jax
import jax.numpy as jnp
import numpy as np
from pattern_reference import np_masked_attention
import pytest

from benchmarks import peer_algorithms as peers
from benchmarks import peers as peers_tool
from benchmarks import published
from efficient_attn.mechanisms.linear import linear_attention
from efficient_attn.mechanisms.random_features import performer_attention
from efficient_attn.ops import feature_maps


def _qkv(n=16, scale=1.0, seed=0, b=2, h=2, d=8):
  rng = np.random.default_rng(seed)
  return tuple(scale * rng.normal(size=(b, n, h, d)) for _ in range(3))


def test_textbook_linear_equals_the_library(x64):
  """Up to the eps: the textbook adds it to the denominator, the library clamps by it."""
  del x64
  q, k, v = _qkv()
  np.testing.assert_allclose(peers.linear(q, k, v), linear_attention(q, k, v), atol=1e-5)
  np.testing.assert_allclose(
    peers.linear_causal(q, k, v), linear_attention(q, k, v, causal=True, chunk_size=5), atol=1e-5
  )


def test_favor_matches_the_library_with_the_same_features(x64):
  """Same projection: the two FAVOR+ estimates agree up to the reference's 1e-6 feature offset."""
  del x64
  q, k, v = _qkv(scale=0.5)
  proj = feature_maps.gaussian_projection(jax.random.PRNGKey(0), 64, 8, orthogonal=True)
  ours = performer_attention(q, k, v, proj)
  np.testing.assert_allclose(peers.favor(q, k, v, proj), ours, atol=1e-4)
  np.testing.assert_allclose(
    peers.favor_causal(q, k, v, proj), performer_attention(q, k, v, proj, causal=True), atol=1e-4
  )


def test_favor_causal_backward_scan_equals_autodiff_of_prefix_sums(x64):
  """The reference's hand-written backward scan against autodiff of the cumsum form."""
  del x64
  q, k, v = (jnp.moveaxis(jnp.abs(x), 1, 0) for x in _qkv(n=9))  # length-major, positive

  def cumsum_form(q, k, v):
    return jnp.einsum(
      'lbhm,lbhmd->lbhd', q, jnp.cumsum(jnp.einsum('lbhm,lbhd->lbhmd', k, v), axis=0)
    )

  w = np.random.default_rng(3).normal(size=v.shape)
  grad = lambda fn: jax.value_and_grad(lambda *a: jnp.sum(fn(*a) * w), argnums=(0, 1, 2))
  got, want = grad(peers._prefix_products)(q, k, v), grad(cumsum_form)(q, k, v)  # pylint: disable=protected-access
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, atol=1e-10)


def test_nystromformer_with_every_token_a_landmark_and_linformer_with_identity_are_exact(x64):
  del x64
  q, k, v = _qkv(n=8, scale=1.5)
  exact = np_masked_attention(q, k, v, np.ones((8, 8), bool))
  np.testing.assert_allclose(
    peers.nystromformer(q, k, v, num_landmarks=8, n_iter=30), exact, atol=1e-6
  )
  eye = np.eye(8)
  np.testing.assert_allclose(peers.linformer(q, k, v, eye, eye), exact, atol=1e-6)


@pytest.mark.slow
def test_a_tiny_run_writes_the_ratio_table_and_skips_over_budget(tmp_path):
  small = [
    '--lengths=32',
    '--features=8',
    '--landmarks=4',
    '--k_proj=8',
    '--head_dim=8',
    '--heads=2',
    '--repeats=1',
    f'--out={tmp_path}',
    '--quiet',
  ]
  data = peers_tool.main(small)
  rows = data['rows']
  assert len(rows) == len(peers_tool.PAIRS)
  fetched = os.path.isfile(published.fast_attention_path())
  for r in rows:  # the published FAVOR+ runs where its file is present, else says so
    if r['peer'] in ('favor_published', 'favor_causal_published') and not fetched:
      assert "peer: google-research's fast_attention.py is not at" in r['skipped']
    else:
      assert r['ratio'] > 0 and not r['skipped'], r
  assert {r['peer_kind'] for r in rows} == {'published', 'recipe'}
  for f in ('peers.json', 'peers.md', 'peers_ratio.png'):
    assert os.path.getsize(tmp_path / f) > 0
  assert 'performer causal vs favor_causal' in (tmp_path / 'peers.md').read_text()
  data = peers_tool.main(small + ['--pairs=performer', '--dtype=bfloat16', '--name=bf16'])
  assert 'bfloat16' in (tmp_path / 'bf16.md').read_text()
  assert all(r['ratio'] > 0 for r in data['rows'] if not r['skipped'])
  data = peers_tool.main(small + ['--pairs=linear', '--memory_budget_gb=1e-7', '--name=tight'])
  assert [r['skipped'].split(':')[0] for r in data['rows']] == ['library', 'library']

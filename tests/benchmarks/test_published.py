"""The published peers of `benchmarks.peers`, run unchanged: loading, checks, and agreement."""

import hashlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import peer_algorithms as peers
from benchmarks import published
from benchmarks.published import gin_shim
from efficient_attn.mechanisms.random_features import performer_attention

_PRESENT = os.path.isfile(published.fast_attention_path())
needs_file = pytest.mark.skipif(
  not _PRESENT,
  reason="google-research's fast_attention.py is not present (see "
  'benchmarks/published/__init__.py)',
)


def _qkv(n=16, scale=0.5, b=1, h=2, d=8):
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  return tuple(scale * jax.random.normal(key, (b, n, h, d)) for key in keys)


def test_a_missing_file_says_where_to_put_it(tmp_path, monkeypatch):
  monkeypatch.delitem(published.sys.modules, published._MODULE, raising=False)  # pylint: disable=protected-access
  monkeypatch.setenv(published.FAST_ATTENTION['env'], str(tmp_path / 'absent.py'))
  with pytest.raises(FileNotFoundError, match='absent.py: fetch performer/fast_attention'):
    published.fast_attention()


def test_an_altered_file_is_refused(tmp_path, monkeypatch):
  """Only the published bytes run: one changed character and the sha256 check refuses it."""
  altered = tmp_path / 'fast_attention.py'
  altered.write_text('# coding=utf-8\n')
  monkeypatch.delitem(published.sys.modules, published._MODULE, raising=False)  # pylint: disable=protected-access
  monkeypatch.setenv(published.FAST_ATTENTION['env'], str(altered))
  digest = hashlib.sha256(altered.read_bytes()).hexdigest()
  with pytest.raises(ValueError, match=f'has sha256 {digest}, not the published'):
    published.fast_attention()


def test_the_gin_stand_in_returns_what_it_is_given():
  fn = lambda x: x
  assert gin_shim.configurable(fn) is fn and gin_shim.configurable('name')(fn) is fn
  assert gin_shim.external_configurable(fn, 'name') is fn


@pytest.mark.parametrize('causal', [False, True])
def test_flax_softmax_is_exact_attention(causal):
  q, k, v = _qkv(scale=1.0)
  np.testing.assert_allclose(
    published.flax_softmax(causal)(q, k, v), peers.exact(q, k, v, causal), atol=1e-6
  )


@needs_file
@pytest.mark.parametrize('causal', [False, True])
def test_published_favor_matches_the_library_with_its_projection(causal):
  """Same projection (the published one's own): the two FAVOR+ estimates agree up to its
  1e-6 feature offset and stabiliser form."""
  q, k, v = _qkv()
  attend = published.fast_attention().make_fast_softmax_attention(
    8, nb_features=64, redraw_features=False, unidirectional=causal
  )
  projection = attend.__self__.projection_matrix
  np.testing.assert_allclose(
    attend(q, k, v), performer_attention(q, k, v, projection, causal=causal), atol=2e-4
  )
  assert published.favor(8, 64, causal)(q, k, v).dtype == jnp.float32

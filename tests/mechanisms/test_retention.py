"""Retention (Sun et al. 2023): naive, chunkwise and decoding forms equal the float64 definition."""

import gated_helpers as gh
import numpy as np
import pytest

from efficient_attn.mechanisms import retention


def reference(p, q, k, v, x):
  """Multi-scale retention, swish gate and per-head norm, in float64 NumPy."""
  b, n, h, dk = q.shape
  g = np.log1p(-(2.0 ** (-5.0 - np.arange(h))))
  g = np.broadcast_to(g[None, None, :, None], (b, n, h, 1))
  out = gh.per_head(gh.decay_recurrence, q, k / np.sqrt(dk), v, g)
  return gh.rms_norm(out) * gh.silu(np.einsum('bnf,fhd->bnhd', x, p['gate_kernel']))


@pytest.mark.parametrize('length', [12, 13])
def test_three_forms_equal_the_definition(length):
  gh.check_three_forms('retention', reference, {'chunk_size': 4}, length=length)


def test_retnets_values_twice_as_wide_equal_the_definition():
  """value_factor=2 (RetNet's layer: values, gate and norm 2 x head_dim wide), at 13 tokens
  (not a multiple of the chunk)."""
  gh.check_three_forms('retention', reference, {'chunk_size': 4, 'value_factor': 2}, length=13)


def test_decays_are_retnets():
  np.testing.assert_allclose(
    np.exp(retention.retention_log_decay(4)), 1 - 2.0 ** -np.arange(5, 9), rtol=1e-6
  )

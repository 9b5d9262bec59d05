"""DeltaNet and Gated DeltaNet: naive, chunkwise (WY) and decoding forms equal the float64
definitions (Schlag et al. 2021; Yang et al. 2024; Yang, Kautz & Hatamizadeh 2025)."""

import gated_helpers as gh
import numpy as np
import pytest


def _features(p, q, k, v):
  """Short conv + SiLU, L2-normalised q (scaled by 1/sqrt(dk)) and k."""
  q, k, v = (gh.silu(gh.causal_conv(a, p[f'{n}_conv'])) for a, n in zip((q, k, v), 'qkv'))
  l2 = lambda a: a / np.sqrt(np.sum(a * a, -1, keepdims=True) + 1e-6)
  return l2(q) / np.sqrt(q.shape[-1]), l2(k), v


def deltanet(p, q, k, v, x):
  q, k, v = _features(p, q, k, v)
  beta = 1.0 / (1.0 + np.exp(-(x @ p['beta_kernel'])))
  out = gh.per_head(gh.delta_recurrence, q, k, v, beta)
  return gh.rms_norm(out) * p['norm_scale']


def gated_deltanet(p, q, k, v, x):
  q, k, v = _features(p, q, k, v)
  beta = 1.0 / (1.0 + np.exp(-(x @ p['beta_kernel'])))
  g = (-np.exp(p['A_log']) * np.logaddexp(0.0, x @ p['decay_kernel'] + p['dt_bias']))[..., None]
  out = gh.per_head(gh.delta_recurrence, q, k, v, beta, g)
  gate = gh.silu(np.einsum('bnf,fhd->bnhd', x, p['gate_kernel']))
  return gh.rms_norm(out) * p['norm_scale'] * gate


@pytest.mark.parametrize(
  'mechanism,reference', [('deltanet', deltanet), ('gated_deltanet', gated_deltanet)]
)
@pytest.mark.parametrize('length', [12, 13])
def test_three_forms_equal_the_definition(mechanism, reference, length):
  gh.check_three_forms(mechanism, reference, {'chunk_size': 4}, length=length)

"""GLA (Yang et al. 2024): naive, chunkwise and decoding forms equal the float64 definition."""

import gated_helpers as gh
import numpy as np
import pytest


def reference(p, q, k, v, x, tau=16.0):
  """Low-rank log-sigmoid decay per key feature, per-head RMSNorm and swish gate (float64)."""
  logits = np.einsum('bnr,rhd->bnhd', x @ p['decay_down'], p['decay_up']) + p['decay_bias']
  g = -np.logaddexp(0.0, -logits) / tau
  out = gh.per_head(gh.decay_recurrence, q / np.sqrt(q.shape[-1]), k, v, g)
  return (
    gh.rms_norm(out) * p['norm_scale'] * gh.silu(np.einsum('bnf,fhd->bnhd', x, p['gate_kernel']))
  )


@pytest.mark.parametrize('length', [12, 13])
def test_three_forms_equal_the_definition(length):
  gh.check_three_forms('gla', reference, {'chunk_size': 4, 'gate_rank': 3}, length=length)

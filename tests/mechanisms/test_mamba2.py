"""Mamba-2 (Dao & Gu 2024): naive, chunkwise and decoding forms equal the float64 definition."""

import functools

import gated_helpers as gh
import jax
import numpy as np
import pytest

import efficient_attn as ea


def reference(p, q, k, v, x, ngroups=None):
  """Short conv (with its bias, as mamba_ssm's) + SiLU on C, B, X (B and C on their groups,
  then repeated to the heads); dt, A per head; D skip; gated RMSNorm over the full width or
  each group (float64)."""
  q, k, v = (
    gh.silu(gh.causal_conv(a, p[f'{n}_conv']) + p.get(f'{n}_conv_bias', 0.0))
    for a, n in zip((q, k, v), 'qkv')
  )
  q, k = (np.repeat(a, v.shape[2] // a.shape[2], axis=2) for a in (q, k))  # shared groups
  dt = np.logaddexp(0.0, x @ p['dt_kernel'] + p['dt_bias'])  # [b, n, h]
  g = (-np.exp(p['A_log']) * dt)[..., None]
  y = gh.per_head(gh.decay_recurrence, q, k * dt[..., None], v, g) + p['D'][:, None] * v
  y = y * gh.silu(np.einsum('bnf,fhd->bnhd', x, p['gate_kernel']))
  b, n, h, d = y.shape  # the norm over each group's heads (ngroups None: the full width)
  groups = ngroups or 1
  return gh.rms_norm(y.reshape(b, n, groups, h // groups * d)).reshape(y.shape) * p['norm_scale']


@pytest.mark.parametrize('length', [12, 13])
def test_three_forms_equal_the_definition(length):
  gh.check_three_forms('mamba2', reference, {'chunk_size': 4}, length=length)


@pytest.mark.parametrize('ngroups,heads', [(1, 2), (2, 4)])
def test_shared_b_and_c_of_d_state_equal_the_definition(ngroups, heads):
  """The paper's layout, ngroups=1 (one B and C for every head; mamba_ssm's Mamba2 default,
  with d_state 128), and ngroups=2 of 4 heads (head i reads group i // 2, as mamba_ssm's
  repeat; the gated norm per group), with d_state 6 != head_dim 4, at 13 tokens (not a
  multiple of the chunk)."""
  gh.check_three_forms(
    'mamba2',
    functools.partial(reference, ngroups=ngroups),
    {'chunk_size': 4, 'ngroups': ngroups, 'd_state': 6},
    length=13,
    heads=heads,
  )


def test_without_its_conv_bias_equals_the_definition():
  gh.check_three_forms('mamba2', reference, {'chunk_size': 4, 'conv_bias': False}, length=13)


def test_initialisation_is_mamba2s():
  """A uniform in [1, 16] and dt = softplus(dt_bias) in [0.001, 0.1], per head; D = 1."""
  decl = ea.get_mechanism('mamba2')
  specs = decl.params(decl.resolve(), heads=256, head_dim=4, max_length=None, causal=True)
  init = lambda name: np.asarray(specs[name].init(jax.random.PRNGKey(0), specs[name].shape))
  a, dt = np.exp(init('A_log')), np.logaddexp(0.0, init('dt_bias'))
  assert 1.0 <= a.min() < 2.0 and 15.0 < a.max() <= 16.0
  assert 0.99e-3 <= dt.min() < 2e-3 and 0.05 < dt.max() <= 0.1001
  np.testing.assert_array_equal(init('D'), 1.0)

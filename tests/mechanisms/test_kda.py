"""Kimi Delta Attention (Kimi Team 2025): its naive, chunkwise (WY, per-feature decay) and
decoding forms equal the float64 definition; decoding equals the parallel form over
hundreds of tokens; a bfloat16 layer stays near the float32 one; fla's initialisation; the
pure function refuses in one line.

The Pallas kernel's per-feature path is tests/ops/test_kernels.py's ('kda': the float64
recurrence, packed rows, gradients; the registry properties with implementation='pallas',
kernel = XLA chunk form), the split layer tests/layers/test_sequence_parallel.py's."""

import gated_helpers as gh
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import mechanisms
from efficient_attn.layers import multi_head as layer_lib


def kda_recurrence(q, k, v, beta, g):
  """S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t:
  q, k, g `[n, dk]`, v `[n, dv]`, beta `[n]` -> o `[n, dv]` (NumPy float64)."""
  s = np.zeros((k.shape[1], v.shape[1]))
  out = []
  for t in range(q.shape[0]):
    s = np.exp(g[t])[:, None] * s
    s = s + beta[t] * np.outer(k[t], v[t] - s.T @ k[t])
    out.append(s.T @ q[t])
  return np.stack(out)


def kda(p, q, k, v, x):
  """The layer's mechanism in NumPy float64, from fla's KimiDeltaAttention."""
  q, k, v = (gh.silu(gh.causal_conv(a, p[f'{n}_conv'])) for a, n in zip((q, k, v), 'qkv'))
  l2 = lambda a: a / np.sqrt(np.sum(a * a, -1, keepdims=True) + 1e-6)
  q, k = l2(q) / np.sqrt(q.shape[-1]), l2(k)
  beta = 1.0 / (1.0 + np.exp(-(x @ p['beta_kernel'])))
  low_rank = lambda name: np.einsum('bnr,rhd->bnhd', x @ p[f'{name}_down'], p[f'{name}_up'])
  g = -np.exp(p['A_log'])[:, None] * np.logaddexp(0.0, low_rank('decay') + p['dt_bias'])
  out = gh.per_head(kda_recurrence, q, k, v, beta, g)
  gate = 1.0 / (1.0 + np.exp(-(low_rank('gate') + p['gate_bias'])))
  return gh.rms_norm(out) * p['norm_scale'] * gate


def test_three_forms_equal_the_definition():
  """13 tokens in chunks of 4 (the last partial): chunk, naive and step equal the NumPy
  definition, and the chunk form's gradients the naive form's in float64."""
  gh.check_three_forms('kda', kda, {'chunk_size': 4}, length=13)


@pytest.fixture(scope='module')
def parallel():
  """(layer, variables, x `[1, 300, 8]`, the float32 chunk form's output): 2 heads of 4,
  chunks of 16, fla's initialisation (decays near 1: a long memory)."""
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 300, 8))
  layer = ea.MultiHeadAttention(
    num_heads=2, mechanism='kda', causal=True, options={'chunk_size': 16}
  )
  variables = layer.init(jax.random.PRNGKey(1), x)
  return layer, variables, x, jax.jit(layer.apply)(variables, x)


def test_decoding_300_tokens_equals_the_parallel_form(parallel):
  """Token-by-token decoding (the state carried over 300 steps) equals the chunk form."""
  layer, variables, x, want = parallel
  dec = layer.clone(decode=True)
  _, cache = dec.apply(variables, x[:, :1], mutable=['cache'])

  @jax.jit
  def run(cache, x):
    def step(cache, xt):
      y, cache = dec.apply({**variables, **cache}, xt[:, None], mutable=['cache'])
      return cache, y[:, 0]

    return jax.lax.scan(step, cache, jnp.swapaxes(x, 0, 1))[1]

  np.testing.assert_allclose(jnp.swapaxes(run(cache, x), 0, 1), want, atol=2e-5, rtol=2e-5)


def test_a_bfloat16_layer_is_stable(parallel):
  """A bfloat16 layer (bfloat16 matmuls, float32 state and decays) over the 300 tokens stays
  finite and within 3e-2 of the float32 layer, relative to the output's scale."""
  layer, variables, x, want = parallel
  got = jax.jit(layer.clone(dtype=jnp.bfloat16).apply)(variables, x.astype(jnp.bfloat16))
  assert got.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(got)))
  error = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)) / jnp.max(jnp.abs(want)))
  assert error < 3e-2, error


def test_fla_initialisation():
  """A uniform in [1, 16] per head, softplus(dt_bias) log-uniform in [0.001, 0.1] per head
  and key feature, every projection and the convolution N(0, 0.02), the output gate's bias
  0; the decays and the output gate per head and key feature (64 heads of 4)."""
  h, d, f = 64, 4, 64
  decl = ea.get_mechanism('kda')
  options = decl.resolve({})
  specs = layer_lib.declared_params(
    decl, options, heads=h, head_dim=d, max_length=None, causal=True, features=f
  )
  p = {
    name: init(jax.random.PRNGKey(i), shape)
    for i, (name, (shape, init)) in enumerate(specs.items())
  }
  a = np.exp(p['A_log'])
  assert p['A_log'].shape == (h,) and 1.0 <= a.min() < 2.0 and 15.0 < a.max() <= 16.0
  dt = np.log(jax.nn.softplus(p['dt_bias']))
  assert p['dt_bias'].shape == (h, d)
  assert (
    np.log(1e-3) - 1e-5 <= dt.min() < np.log(2e-3) and np.log(0.05) < dt.max() <= np.log(0.1) + 1e-5
  )
  for name in ('decay_down', 'decay_up', 'gate_down', 'gate_up', 'beta_kernel', 'q_conv'):
    assert abs(float(np.std(p[name])) - 0.02) < 0.004, name
  assert p['decay_up'].shape == (d, h, d) and not np.any(p['gate_bias'])
  gates = decl.gates(options, p, jnp.ones((1, 3, f)))
  assert gates['log_decay'].shape == (1, 3, h, d) and gates['output'].shape == (1, 3, h, d)


def test_the_pure_function_refuses_a_bad_decay_in_one_line():
  q = jnp.zeros((1, 5, 2, 4))
  with pytest.raises(ValueError) as e:
    mechanisms.kda_attention(q, q, q, jnp.ones((1, 5, 2)), jnp.zeros((1, 5, 2, 3)))
  assert str(e.value).startswith(
    'kda_attention: log_decay of shape (1, 5, 2, 3) does not fit q (1, 5, 2, 4); '
    'valid: [1, 5, 2, 4] or [1, 5, 2, 1]'
  )
  assert '\n' not in str(e.value)
  assert mechanisms.pure_function('kda') is mechanisms.kda_attention

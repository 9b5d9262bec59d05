"""Every mechanism family's pure function, reachable from `efficient_attn.mechanisms`.

The README promises one pure function per family on `[batch, length, heads, d]`
arrays. The gated recurrences' (retention, GLA, Mamba-2, DeltaNet, Gated DeltaNet)
are the recurrence alone, the layer's parameters (convolution, gate projections,
output norm) left out: each equals the mechanism's own token-by-token scan of the
inputs its layer builds, in both forms, and a padded token changes nothing.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import mechanisms
from efficient_attn import registry
from efficient_attn.mechanisms import gated_family

B, N, H, D = 2, 11, 2, 4  # 11 tokens: chunks of 4 with a padded last one


def test_every_registered_family_has_its_pure_function():
  missing = {}
  for name in registry.list_mechanisms():
    function = mechanisms.FUNCTIONS.get(name, f'{name}_attention')
    if not callable(getattr(ea.mechanisms, function, None)):
      missing[name] = function
    else:
      assert mechanisms.pure_function(name) is getattr(ea.mechanisms, function)
  assert not missing, f'families without their pure function in ea.mechanisms: {missing}'
  assert set(mechanisms.FUNCTIONS.values()) <= set(dir(mechanisms))
  from efficient_attn.mechanisms import softmax_attention  # pylint: disable=g-import-not-at-top
  from efficient_attn.ops import scaled_dot_product  # pylint: disable=g-import-not-at-top

  assert softmax_attention is scaled_dot_product.softmax_attention  # moved, and re-exported here
  with pytest.raises(ValueError, match="mechanism 'nope' is not registered; valid choices: "):
    mechanisms.pure_function('nope')


def _gates(name, params):
  """The gates the mechanism's layer would compute from its input, drawn at random."""
  rng = np.random.default_rng(1)
  x = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  if name == 'gla':
    return {'log_decay': jax.nn.log_sigmoid(x(B, N, H, D)) / 16.0}
  if name == 'mamba2':
    return {'dt': jax.nn.softplus(x(B, N, H))}
  gates = {'beta': jax.nn.sigmoid(x(B, N, H))} if 'deltanet' in name else {}
  if name == 'gated_deltanet':
    gates['log_decay'] = -jnp.exp(params['A_log']) * jax.nn.softplus(x(B, N, H))
  return gates


def _pure(name, q, k, v, gates, params, **kwargs):
  """The family's pure function on the recurrence's inputs."""
  if name == 'retention':
    return ea.mechanisms.retention_attention(q, k, v, **kwargs)
  if name == 'gla':
    return ea.mechanisms.gla_attention(q, k, v, gates['log_decay'], **kwargs)
  if name == 'mamba2':
    return ea.mechanisms.mamba2_attention(
      q, k, v, gates['dt'], params['A_log'], params['D'], **kwargs
    )
  return ea.mechanisms.delta_rule_attention(
    q, k, v, gates['beta'], gates.get('log_decay'), **kwargs
  )


GATED = ('deltanet', 'gated_deltanet', 'gla', 'mamba2', 'retention')


def test_the_gated_families_are_these():
  assert set(GATED) == set(
    registry.names_where(lambda m: isinstance(m, gated_family.GatedRecurrence))
  )


def _inputs(name):
  decl = ea.get_mechanism(name)
  options = decl.resolve({})
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((B, N, H, D)), jnp.float32) for _ in range(3))
  params = {'A_log': jnp.log(jnp.asarray([2.0, 8.0])), 'D': jnp.asarray([0.5, -1.0])}
  return decl, options, q, k, v, params, _gates(name, params)


@pytest.mark.parametrize('name', GATED)
def test_a_gated_pure_function_is_the_mechanisms_scan(name):
  decl, options, q, k, v, params, gates = _inputs(name)
  want, _ = decl.cores.scan(*decl.recurrence_inputs(options, params, q, k, v, gates))
  if name == 'mamba2':
    want = want + params['D'][:, None] * v  # y = S^T C + D X, before the gated norm
  for form in ('chunk', 'naive'):
    got = _pure(name, q, k, v, gates, params, form=form, chunk_size=4)
    assert got.shape == (B, N, H, D) and got.dtype == v.dtype
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f'{name} {form}')


@pytest.mark.parametrize('name', GATED)
def test_a_padded_token_neither_writes_nor_decays(name):
  """Left padding: the real tokens' outputs are those of the sequence without the pads."""
  _, _, q, k, v, params, gates = _inputs(name)
  pads = 3
  mask = jnp.arange(N)[None, :].repeat(B, 0) >= pads
  got = _pure(name, q, k, v, gates, params, mask=mask, chunk_size=4)
  cut = {key: x[:, pads:] for key, x in gates.items()}
  want = _pure(name, q[:, pads:], k[:, pads:], v[:, pads:], cut, params, chunk_size=4)
  np.testing.assert_allclose(got[:, pads:], want, rtol=2e-5, atol=2e-5)
  assert not np.asarray(got[:, :pads]).any()


def test_a_bad_call_is_one_line_naming_the_function():
  _, _, q, k, v, params, gates = _inputs('gla')
  cases = [
    (
      lambda: ea.mechanisms.retention_attention(q, k, v, form='fast'),
      "retention_attention: form='fast' is not valid",
    ),
    (
      lambda: ea.mechanisms.gla_attention(q, k, v, gates['log_decay'], chunk_size=0),
      'gla_attention: chunk_size=0 is not valid',
    ),
    (
      lambda: ea.mechanisms.gla_attention(q, k, v, gates['log_decay'][..., :3]),
      'gla_attention: log_decay of shape (2, 11, 2, 3) does not fit q (2, 11, 2, 4); '
      'valid: [2, 11, 2, 4] or [2, 11, 2, 1]',
    ),
    (
      lambda: ea.mechanisms.delta_rule_attention(q, k, v, jnp.ones((B, N))),
      'delta_rule_attention: beta of shape (2, 11) does not fit',
    ),
    (
      lambda: ea.mechanisms.mamba2_attention(q, k[:, :5], v, jnp.ones((B, N, H)), params['A_log']),
      'mamba2_attention',
    ),
  ]
  for call, message in cases:
    with pytest.raises(ValueError) as e:
      call()
    assert str(e.value).startswith(message) and '\n' not in str(e.value), e.value

"""Every mechanism family's pure function, reachable from `efficient_attn.mechanisms`.

The README promises one pure function per family on `[batch, length, heads, d]`
arrays. The gated recurrences' (retention, GLA, Mamba-2, DeltaNet, Gated DeltaNet)
are the recurrence alone, the layer's parameters (convolution, gate projections,
output norm) left out: each equals the mechanism's own token-by-token scan of the
inputs its layer builds, in both forms, and a padded token changes nothing. The checks
take each gated declaration's own hooks (its `gates`, `run_pure_function` and `skip`),
so they name no family.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import mechanisms
from efficient_attn import registry
from efficient_attn.layers import multi_head as layer_lib
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


GATED = registry.names_where(lambda m: isinstance(m, gated_family.GatedRecurrence))
FEATURES = 3  # of the layer input the gates are read from


def test_the_gated_families_are_these():
  """Every gated family, these five and any added later, calls its pure function from its
  declaration (`run_pure_function`), which the checks below use."""
  assert {'deltanet', 'gated_deltanet', 'gla', 'mamba2', 'retention'} <= set(GATED)
  base = gated_family.GatedRecurrence.run_pure_function
  assert all(type(ea.get_mechanism(name)).run_pure_function is not base for name in GATED)


def _inputs(name):
  """The declaration, its options, q, k, v `[B, N, H, D]`, its parameters (every declared
  one drawn at random) and the gates its layer computes from a random input."""
  decl = ea.get_mechanism(name)
  options = decl.resolve({})
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((B, N, H, D)), jnp.float32) for _ in range(3))
  specs = layer_lib.declared_params(
    decl, options, heads=H, head_dim=D, max_length=None, causal=True, features=FEATURES
  )
  draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  params = {key: draw(*spec.shape) for key, spec in sorted(specs.items())}
  return decl, options, q, k, v, params, decl.gates(options, params, draw(B, N, FEATURES))


@pytest.mark.parametrize('name', GATED)
def test_a_gated_pure_function_is_the_mechanisms_scan(name):
  decl, options, q, k, v, params, gates = _inputs(name)

  # Each side one compiled program (eagerly, every operation would compile alone).
  @jax.jit
  def scan(q, k, v, gates, params):
    out, _ = decl.cores.scan(*decl.recurrence_inputs(options, params, q, k, v, gates))
    return out + decl.skip(options, params, v)  # Mamba-2's y = S^T C + D X, before the norm

  want = scan(q, k, v, gates, params)
  for form in ('chunk', 'naive'):
    pure = functools.partial(decl.run_pure_function, form=form, chunk_size=4)
    got = jax.jit(pure)(q, k, v, gates, params)
    assert got.shape == (B, N, H, D) and got.dtype == v.dtype
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f'{name} {form}')


@pytest.mark.parametrize('name', GATED)
def test_a_padded_token_neither_writes_nor_decays(name):
  """Left padding: the real tokens' outputs are those of the sequence without the pads."""
  decl, _, q, k, v, params, gates = _inputs(name)
  pads = 3
  mask = jnp.arange(N)[None, :].repeat(B, 0) >= pads
  pure = jax.jit(functools.partial(decl.run_pure_function, chunk_size=4))  # one program each
  got = pure(q, k, v, gates, params, mask=mask)
  cut = {key: x[:, pads:] for key, x in gates.items()}
  want = pure(q[:, pads:], k[:, pads:], v[:, pads:], cut, params)
  np.testing.assert_allclose(got[:, pads:], want, rtol=2e-5, atol=2e-5)
  assert not np.asarray(got[:, :pads]).any()


def test_a_bad_call_is_one_line_naming_the_function():
  _, _, q, k, v, _, gates = _inputs('gla')
  a_log = jnp.log(jnp.asarray([2.0, 8.0]))
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
      lambda: ea.mechanisms.mamba2_attention(q, k[:, :5], v, jnp.ones((B, N, H)), a_log),
      'mamba2_attention',
    ),
  ]
  for call, message in cases:
    with pytest.raises(ValueError) as e:
      call()
    assert str(e.value).startswith(message) and '\n' not in str(e.value), e.value

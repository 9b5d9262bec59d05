"""The gated recurrences' shared declaration (efficient_attn.mechanisms.gated_family): every
member is registered causal only and reads the layer input, refuses a non-causal call in one
line, lets no padded token write or decay, and runs its chunk form in bfloat16 in a bfloat16
layer."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.mechanisms import gated_family
from efficient_attn.models import TransformerConfig
import efficient_attn.nnx as ean

GATED = registry.names_where(lambda m: isinstance(m, gated_family.GatedRecurrence))


def test_the_family_is_registered_causal_only_and_reads_the_input():
  assert set(GATED) == {
    'retention',
    'gla',
    'mamba2',
    'deltanet',
    'gated_deltanet',
    'gated_deltaproduct',
    'kda',
    'rwkv7',
  }
  for name in GATED:
    decl = ea.get_mechanism(name)
    assert decl.causal_only and decl.reads_input and decl.decode == 'recurrent'
    assert not decl.parameter_free and 'only' in decl.describe()


@pytest.mark.parametrize('mechanism', GATED)
def test_a_non_causal_call_and_a_missing_input_are_refused_in_one_line(mechanism):
  x = jnp.zeros((1, 8, 8))
  for make in (
    lambda: ea.MultiHeadAttention(num_heads=2, mechanism=mechanism).init(jax.random.PRNGKey(0), x),
    lambda: ean.MultiHeadAttention(2, 8, mechanism=mechanism, rngs=nnx.Rngs(0)),
  ):
    with pytest.raises(ValueError, match=f"'{mechanism}' is causal only.*causal=True") as e:
      make()
    assert '\n' not in str(e.value)
  q = jnp.zeros((1, 8, 2, 4))
  with pytest.raises(ValueError, match=f"'{mechanism}' reads the layer input.*inputs="):
    ea.mechanism_module(mechanism, causal=True).init(jax.random.PRNGKey(0), q, q, q)
  with pytest.raises(ValueError, match='cannot be an attention_fn'):
    ea.make_attention_fn(mechanism)


@pytest.mark.parametrize('mechanism', GATED)
def test_left_padding_neither_writes_nor_decays(mechanism):
  """A sequence after 5 padded tokens gives the outputs of the sequence alone: the padded
  tokens wrote nothing, decayed nothing and fed no convolution."""
  n, pad = 11, 5
  x = jax.random.normal(jax.random.PRNGKey(0), (1, n + pad, 8))
  layer = ea.MultiHeadAttention(
    num_heads=2, mechanism=mechanism, causal=True, options={'chunk_size': 4}
  )
  valid = jnp.arange(n + pad)[None] >= pad

  @jax.jit  # one compiled program (eagerly, every operation would compile alone)
  def run(x):
    variables = layer.init(jax.random.PRNGKey(1), x)
    return layer.apply(variables, x, mask=valid), layer.apply(variables, x[:, pad:])

  padded, alone = run(x)
  np.testing.assert_allclose(padded[:, pad:], alone, atol=2e-5, rtol=2e-5)


def test_configs_run_the_family_causally_and_refuse_a_class_token():
  from configs import cifar10  # pylint: disable=g-import-not-at-top
  from train import validate  # pylint: disable=g-import-not-at-top

  config = cifar10.get_config('gla,size=small')
  validate.validate_config(config)  # an encoder, mean-pooled: accepted
  assert TransformerConfig(mechanism='gla').attention_causal
  assert not TransformerConfig(mechanism='linear').attention_causal
  config.model.pool = 'cls'
  with pytest.raises(validate.ConfigError, match="pool='cls' with mechanism 'gla'.*'mean'"):
    validate.validate_config(config)


@pytest.mark.parametrize(
  'mechanism', ['retention', 'gla', 'mamba2', 'deltanet', 'gated_deltanet', 'kda']
)
def test_a_bfloat16_layer_runs_its_chunk_form_in_bfloat16(mechanism, monkeypatch):
  """A bfloat16 layer hands the chunk form bfloat16 q, k, v (its matrix products then run in
  bfloat16 with float32 accumulation; it upcast everything before), and its output stays
  within 3e-2 of the float32 layer's, relative to the output's scale."""
  seen = []
  core = gated_family.GatedRecurrence.core

  def spy(self, options, dtype, **kwargs):
    seen.append(jnp.dtype(dtype))
    return core(self, options, dtype, **kwargs)

  monkeypatch.setattr(gated_family.GatedRecurrence, 'core', spy)
  layer = ea.MultiHeadAttention(
    num_heads=2, mechanism=mechanism, causal=True, options={'chunk_size': 8}
  )
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 24, 16))

  @jax.jit  # one compiled program, traced once: the spy sees init, then the two applies
  def run(x):
    variables = layer.init(jax.random.PRNGKey(1), x)
    want = layer.apply(variables, x)
    return want, layer.clone(dtype=jnp.bfloat16).apply(variables, x.astype(jnp.bfloat16))

  want, got = run(x)
  assert seen == [jnp.dtype(jnp.float32)] * 2 + [jnp.dtype(jnp.bfloat16)], seen
  assert got.dtype == jnp.bfloat16
  got, want = np.asarray(got).astype(np.float32), np.asarray(want)
  error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
  assert error < 3e-2, error

"""The chunkwise recurrences equal their float64 definitions (efficient_attn.ops.gated_linear,
efficient_attn.ops.delta_rule): lengths that are and are not multiples of the chunk, decays per
head and per feature, and 8K tokens of strong decay and of none."""

from flax import nnx
import gated_helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.models import TransformerConfig
import efficient_attn.nnx as ean
from efficient_attn.ops import delta_rule
from efficient_attn.ops import gated_linear


def _decay_inputs(n, dg, seed=0, strength=1.0, b=1, h=2, dk=3, dv=2):
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((b, n, h, dk)) for _ in range(2))
  v = rng.standard_normal((b, n, h, dv))
  g = -strength * rng.uniform(0.0, 1.0, (b, n, h, dg))
  return q, k, v, g


@pytest.mark.parametrize('dg', [1, 3])  # retention / Mamba-2; GLA
@pytest.mark.parametrize('n', [12, 13])  # a multiple of the chunk, and not
def test_decay_forms_equal_the_recurrence(dg, n):
  q, k, v, g = _decay_inputs(n, dg)
  want = gated_helpers.per_head(gated_helpers.decay_recurrence, q, k, v, g)
  f32 = [jnp.asarray(a, jnp.float32) for a in (q, k, v, g)]
  chunk, s_chunk = gated_linear.gated_chunked(*f32, chunk_size=4)
  naive, s_naive = gated_linear.gated_scan(*f32)
  for sub in (1, 2):  # sub-chunks of a per-feature decay's scores
    np.testing.assert_allclose(
      gated_linear.gated_chunked(*f32, chunk_size=4, sub_chunk=sub)[0], want, atol=1e-5, rtol=1e-5
    )
  np.testing.assert_allclose(chunk, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(naive, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(s_chunk, s_naive, atol=1e-5, rtol=1e-5)
  s, outs = gated_linear.init_gated_state(1, 2, 3, 2), []
  for t in range(n):
    s, out_t = gated_linear.gated_step(s, *(a[:, t] for a in f32))
    outs.append(out_t)
  np.testing.assert_allclose(jnp.stack(outs, 1), want, atol=1e-5, rtol=1e-5)
  loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a)[0]))
  grads = jax.grad(
    loss(lambda *a: gated_linear.gated_chunked(*a, chunk_size=4, sub_chunk=2)), argnums=(0, 1, 2, 3)
  )(*f32)
  with jax.enable_x64(True):
    want_grads = jax.grad(loss(gated_linear.gated_scan), argnums=(0, 1, 2, 3))(
      *(jnp.asarray(a, jnp.float64) for a in (q, k, v, g))
    )
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('strength', [0.0, 30.0])  # no decay; decays down to e^-30 a token
@pytest.mark.parametrize('dg', [1, 2])
def test_decay_8k_tokens_are_finite_and_exact(strength, dg):
  n = 8192
  q, k, v, g = _decay_inputs(n, dg, seed=1, strength=strength, h=1, dk=2, dv=2)
  want = gated_helpers.per_head(gated_helpers.decay_recurrence, q, k, v, g)
  got, _ = jax.jit(lambda *a: gated_linear.gated_chunked(*a, chunk_size=64))(
    *(jnp.asarray(a, jnp.float32) for a in (q, k, v, g))
  )
  assert bool(jnp.all(jnp.isfinite(got)))
  scale = np.abs(want).max()
  np.testing.assert_allclose(got, want, atol=2e-5 * scale, rtol=1e-4)


def _delta_inputs(n, seed=0, gated=True, strength=1.0, b=1, h=2, dk=3, dv=2):
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((b, n, h, dk)) for _ in range(2))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the mechanisms' L2-normalised keys
  v = rng.standard_normal((b, n, h, dv))
  beta = rng.uniform(0.0, 1.0, (b, n, h))
  g = -strength * rng.uniform(0.0, 1.0, (b, n, h, 1)) if gated else None
  return q, k, v, g, beta


def _delta_reference(q, k, v, g, beta):
  if g is None:
    return gated_helpers.per_head(gated_helpers.delta_recurrence, q, k, v, beta)
  return gated_helpers.per_head(gated_helpers.delta_recurrence, q, k, v, beta, g)


@pytest.mark.parametrize('gated', [False, True])  # DeltaNet; Gated DeltaNet
@pytest.mark.parametrize('n', [12, 13])
def test_delta_rule_forms_equal_the_recurrence(gated, n):
  q, k, v, g, beta = _delta_inputs(n, gated=gated)
  want = _delta_reference(q, k, v, g, beta)
  f32 = lambda a: None if a is None else jnp.asarray(a, jnp.float32)
  args = [f32(a) for a in (q, k, v, g, beta)]
  chunk, s_chunk = delta_rule.delta_chunked(*args, chunk_size=4)
  naive, s_naive = delta_rule.delta_scan(*args)
  np.testing.assert_allclose(chunk, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(naive, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(s_chunk, s_naive, atol=1e-5, rtol=1e-5)
  s, outs = gated_linear.init_gated_state(1, 2, 3, 2), []
  for t in range(n):
    s, out_t = delta_rule.delta_step(s, *(None if a is None else a[:, t] for a in args))
    outs.append(out_t)
  np.testing.assert_allclose(jnp.stack(outs, 1), want, atol=1e-5, rtol=1e-5)
  argnums = (0, 1, 2, 3, 4) if gated else (0, 1, 2, 4)
  loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a)[0]))
  grads = jax.grad(loss(lambda *a: delta_rule.delta_chunked(*a, chunk_size=4)), argnums=argnums)(
    *args
  )
  with jax.enable_x64(True):
    want_grads = jax.grad(loss(delta_rule.delta_scan), argnums=argnums)(
      *(None if a is None else jnp.asarray(a, jnp.float64) for a in (q, k, v, g, beta))
    )
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('strength', [None, 30.0])  # DeltaNet (no decay); strong decay
def test_delta_rule_8k_tokens_are_finite_and_exact(strength):
  n = 8192
  q, k, v, g, beta = _delta_inputs(
    n, seed=1, gated=strength is not None, strength=strength or 0.0, h=1, dk=2, dv=2
  )
  want = _delta_reference(q, k, v, g, beta)
  got, _ = jax.jit(lambda *a: delta_rule.delta_chunked(*a, chunk_size=64))(
    *(None if a is None else jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta))
  )
  assert bool(jnp.all(jnp.isfinite(got)))
  np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=1e-4)


def test_causal_conv_and_its_gradients_equal_the_float64_definition():
  """causal_conv's own backward (the kernel's gradient as matrix products) against autodiff of
  out_t = sum_i w[i] x_{t - K + 1 + i} in float64."""
  rng = np.random.default_rng(3)
  x, d_out = (rng.standard_normal((2, 7, 2, 3)) for _ in range(2))
  w = rng.standard_normal((4, 2, 3))

  def definition(x, w):
    xp = jnp.pad(x, [(0, 0), (3, 0), (0, 0), (0, 0)])
    return sum(w[i] * xp[:, i : i + x.shape[1]] for i in range(4))

  out, vjp = jax.vjp(gated_linear.causal_conv, *(jnp.asarray(a, jnp.float32) for a in (x, w)))
  with jax.enable_x64(True):
    want, want_vjp = jax.vjp(definition, jnp.asarray(x), jnp.asarray(w))
    want_grads = want_vjp(jnp.asarray(d_out))
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
  for got, ref in zip(vjp(jnp.asarray(d_out, jnp.float32)), want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


GATED = registry.names_where(lambda m: isinstance(m, gated_linear.GatedRecurrence))


def test_the_family_is_registered_causal_only_and_reads_the_input():
  assert set(GATED) == {'retention', 'gla', 'mamba2', 'deltanet', 'gated_deltanet'}
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
  variables = layer.init(jax.random.PRNGKey(1), x)
  valid = jnp.arange(n + pad)[None] >= pad
  padded = layer.apply(variables, x, mask=valid)
  alone = layer.apply(variables, x[:, pad:])
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


@pytest.mark.parametrize('mechanism', ['retention', 'gla', 'mamba2', 'deltanet', 'gated_deltanet'])
def test_a_bfloat16_layer_runs_its_chunk_form_in_bfloat16(mechanism, monkeypatch):
  """A bfloat16 layer hands the chunk form bfloat16 q, k, v (its matrix products then run in
  bfloat16 with float32 accumulation; it upcast everything before), and its output stays
  within 3e-2 of the float32 layer's, relative to the output's scale."""
  seen = []
  core = gated_linear.GatedRecurrence.core

  def spy(self, options, dtype):
    seen.append(jnp.dtype(dtype))
    return core(self, options, dtype)

  monkeypatch.setattr(gated_linear.GatedRecurrence, 'core', spy)
  layer = ea.MultiHeadAttention(
    num_heads=2, mechanism=mechanism, causal=True, options={'chunk_size': 8}
  )
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 24, 16))
  variables = layer.init(jax.random.PRNGKey(1), x)
  want = layer.apply(variables, x)
  got = layer.clone(dtype=jnp.bfloat16).apply(variables, x.astype(jnp.bfloat16))
  assert seen == [jnp.dtype(jnp.float32)] * 2 + [jnp.dtype(jnp.bfloat16)], seen
  assert got.dtype == jnp.bfloat16
  error = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)) / jnp.max(jnp.abs(want)))
  assert error < 3e-2, error

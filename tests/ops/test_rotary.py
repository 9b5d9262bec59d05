"""Rotary positions (RoPE, Su et al. 2021): relative scores, RoFormer's kernel form, decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.layers import decoding
from efficient_attn.mechanisms.softmax import softmax_attention
from efficient_attn.ops import rotary

B, L, D, H = 2, 12, 16, 2
ROTARY = registry.names_where(lambda m: bool(m.rotary))
WITHOUT = registry.names_where(lambda m: not m.rotary)


def _rot64(x, pos):
  """float64 NumPy rotation of x `[n, f]` at positions `[n]` (the definition)."""
  f = x.shape[-1]
  inv = 10000.0 ** (-np.arange(f // 2) * 2.0 / f)
  th = np.asarray(pos, np.float64)[:, None] * inv
  x1, x2 = x[:, : f // 2], x[:, f // 2 :]
  return np.concatenate([x1 * np.cos(th) - x2 * np.sin(th), x2 * np.cos(th) + x1 * np.sin(th)], -1)


def test_rotate_matches_the_definition_and_scores_depend_only_on_offsets():
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(2, 8, 1, 6)), rng.normal(size=(2, 8, 1, 6))
  pos = np.arange(8)
  np.testing.assert_allclose(
    jax.jit(rotary.rotate)(jnp.asarray(q, jnp.float32), pos)[0, :, 0],
    _rot64(q[0, :, 0], pos),
    atol=1e-5,
  )
  scores = lambda shift: np.einsum(
    'qf,kf->qk', _rot64(q[0, :, 0], pos + shift), _rot64(k[0, :, 0], pos + shift)
  )
  np.testing.assert_allclose(scores(0), scores(37), atol=1e-9)  # relative: shift-invariant
  plain = np.einsum('qf,kf->qk', q[0, :, 0], k[0, :, 0])
  assert not np.allclose(scores(0), plain)  # and position-dependent
  with pytest.raises(ValueError, match='dimension 5 is odd'):
    rotary.rotate(jnp.ones((1, 2, 1, 5)), jnp.arange(2))


def test_rotated_softmax_layer_is_softmax_of_rotated_projections():
  x = jax.random.normal(jax.random.key(0), (B, L, D))
  layer = ea.MultiHeadAttention(num_heads=H, rotary=True)

  @jax.jit  # one compiled program (eagerly, every operation would compile alone)
  def run(x):
    variables = layer.init(jax.random.key(1), x)
    _, inter = layer.apply(variables, x, mutable=['attention_qkv'])
    q, k, v = inter['attention_qkv']['qkv'][0]
    pos = jnp.arange(L)
    heads = softmax_attention(rotary.rotate(q, pos), rotary.rotate(k, pos), v)
    p = variables['params']['out']
    want = jnp.einsum('bqhd,hdf->bqf', heads, p['kernel']) + p['bias']
    return layer.apply(variables, x), want

  got, want = run(x)
  np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('feature_map', ['elu', 'relu'])
def test_kernel_form_is_roformers_linear_attention(causal, feature_map):
  """Rotated features in the numerator, unrotated in the denominator (float64 reference)."""
  rng = np.random.default_rng(1)
  q, k, v = (rng.normal(size=(1, 10, 1, 4)) for _ in range(3))
  pos = np.arange(10)
  got = jax.jit(
    lambda q, k, v: ea.mechanisms.linear_attention(
      q,
      k,
      v,
      causal=causal,
      feature_map=feature_map,
      chunk_size=4,
      positions=rotary.positions_of(10, 10),
    )
  )(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)))
  phi = (
    (lambda a: np.where(a > 0, a + 1, np.exp(a)))
    if feature_map == 'elu'
    else (lambda a: np.maximum(a, 0))
  )
  fq, fk = phi(q[0, :, 0]), phi(k[0, :, 0])
  num_w = _rot64(fq, pos) @ _rot64(fk, pos).T
  den_w = fq @ fk.T
  if causal:
    num_w, den_w = np.tril(num_w), np.tril(den_w)
  den = den_w.sum(-1, keepdims=True)
  want = (num_w @ v[0, :, 0]) / np.maximum(den, 1e-6)
  np.testing.assert_allclose(got[0, :, 0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
  'mechanism', [m for m in decoding.decodable_mechanisms() if registry.get_mechanism(m).rotary]
)
def test_decoding_with_rotary_matches_the_parallel_form(mechanism):
  """Positions come from the cache index: stepping equals the parallel causal layer."""
  x = jax.random.normal(jax.random.key(0), (B, L, D))
  layer = ea.MultiHeadAttention(
    num_heads=H,
    mechanism=mechanism,
    causal=True,
    rotary=True,
    options=ea.get_mechanism(mechanism).example,
  )
  dec = layer.clone(decode=True)

  @jax.jit  # one compiled program (eagerly, every operation would compile alone)
  def run(x):
    variables = layer.init(jax.random.key(1), x)
    cache = dec.apply(variables, x, mutable=['cache'])[1]  # the empty cache alone
    plain = layer.clone(rotary=False).apply(variables, x)
    return variables, cache, layer.apply(variables, x), plain

  variables, cache, parallel, plain = run(x)
  step = jax.jit(lambda cache, x_t: dec.apply({**variables, **cache}, x_t, mutable=['cache']))
  outs, x = [], np.asarray(x)
  for t in range(L):  # one compiled step, reused at every position
    y, cache = step(cache, x[:, t : t + 1])
    outs.append(y)
  np.testing.assert_allclose(np.concatenate(outs, 1), parallel, atol=3e-5, rtol=3e-5)
  assert not np.allclose(parallel, plain, atol=1e-3)  # the positions do something


# 'scores' mechanisms see rotated q, k (position-wise, so their own causality, tested in
# test_attention, carries over); the kernel form rotates inside the causal scan.
@pytest.mark.parametrize(
  'mechanism', ('softmax',) + registry.names_where(lambda m: m.rotary == 'features')
)
def test_rotary_keeps_causal_forms_causal(mechanism):
  x = jax.random.normal(jax.random.key(0), (1, L, D))
  layer = ea.MultiHeadAttention(
    num_heads=H,
    mechanism=mechanism,
    causal=True,
    rotary=True,
    options=ea.get_mechanism(mechanism).example,
    max_length=L,
  )

  @jax.jit  # one compiled program (eagerly, every operation would compile alone)
  def jacobian(x):
    variables = layer.init(jax.random.key(1), x)
    return jax.jacrev(lambda z: layer.apply(variables, z)[0])(x)  # [L, D, 1, L, D]

  dep = np.abs(np.asarray(jacobian(x))[:, :, 0]).sum(axis=(1, 3))
  assert np.max(np.triu(dep, k=1)) == 0.0 and np.count_nonzero(np.tril(dep)) >= L


@pytest.mark.parametrize('mechanism', WITHOUT)
def test_mechanisms_without_scores_refuse_rotary(mechanism):
  layer = ea.MultiHeadAttention(num_heads=H, mechanism=mechanism, rotary=True, max_length=L)
  with pytest.raises(
    ValueError,
    match=rf"{mechanism}' cannot take rotary positions.*"
    r'mechanisms that can: softmax',
  ):
    layer.init(jax.random.key(0), jnp.ones((B, L, D)))


def test_config_rotary_is_checked_before_any_work():
  from configs import cifar10  # pylint: disable=g-import-not-at-top
  from train import validate  # pylint: disable=g-import-not-at-top

  config = cifar10.get_config('synthesizer,size=small')
  config.attention.rotary = True
  with pytest.raises(validate.ConfigError, match="cannot take rotary positions"):
    validate.resolved(config, read_data=False)
  config = cifar10.get_config('performer,size=small')
  config.attention.rotary = True
  assert validate.resolved(config, read_data=False).attention.rotary

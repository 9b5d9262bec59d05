"""Tests of the kernel-attention core and linear attention (tiny shapes, CPU)."""

import functools

from helpers import PAD
from helpers import assert_no_lookahead
from helpers import np_kernel_ref
from helpers import value_and_grads
import jax
import jax.numpy as jnp
import numpy as np
import pattern_reference
import pytest

import efficient_attn as ea
from efficient_attn.mechanisms import linear
from efficient_attn.ops import feature_maps

FEATURE_MAPS = ('elu', 'relu', 'identity', 'taylor')
EPS = 1e-6


# ---------------------------------------------------------------------------
# NumPy float64 reference: the quadratic form of the definition.
# ---------------------------------------------------------------------------


def np_phi(x, name):
  if name == 'elu':
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
  if name == 'relu':
    return np.maximum(x, 0.0)
  if name == 'taylor':  # weights 1 + s + s^2 / 2, s = q . k / sqrt(d), from the features
    d = x.shape[-1]
    outer = np.einsum('...i,...j->...ij', x, x).reshape(x.shape[:-1] + (d * d,))
    return np.concatenate(
      [np.ones(x.shape[:-1] + (1,)), x / d**0.25, outer / np.sqrt(2.0 * d)], axis=-1
    )
  return x


def test_taylor_weights_are_the_second_order_expansion_of_exp(x64):
  """Linear attention with the Taylor map weights key j by 1 + s + s^2 / 2 (s = q . k /
  sqrt(d)): the explicit quadratic form, in float64."""
  q, k, v = (np.asarray(x, np.float64) for x in inputs(dtype=jnp.float64))
  s = np.einsum('blhd,bmhd->bhlm', q, k) / np.sqrt(q.shape[-1])
  w = (1 + s + s * s / 2) * np.asarray(PAD)[:, None, None, :]
  ref = np.einsum('bhlm,bmhe->blhe', w, v) / w.sum(-1).transpose(0, 2, 1)[..., None]
  out = jax.jit(functools.partial(linear.linear_attention, feature_map='taylor'))(
    *(jnp.asarray(x) for x in (q, k, v)), jnp.asarray(PAD)
  )
  np.testing.assert_allclose(out, ref, rtol=1e-10)
  state = linear.init_kernel_state(2, 2, 1 + 4 + 16, 3, jnp.float64)
  for call in (
    lambda: linear.linear_attention(
      q, k, v, feature_map='taylor', causal=True, positions=(jnp.arange(10), jnp.arange(10))
    ),
    lambda: linear.linear_attention_step(
      state, q[:, 0], k[:, 0], v[:, 0], feature_map='taylor', position=3
    ),
  ):
    with pytest.raises(
      ValueError,
      match="cannot rotate the 'taylor' .*valid: rotary=False, or feature_map elu, relu, identity$",
    ):
      call()


def np_linear_ref(q, k, v, feature_map, key_padding=None, causal=False):
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  phi_q, phi_k = np_phi(q, feature_map), np_phi(k, feature_map)
  if feature_map == 'identity':  # the seeds' (1/d_k) Q (K^T V), no denominator
    return np_kernel_ref(
      phi_q / q.shape[-1], phi_k, v, key_padding, causal, eps=EPS, normalize=False
    )
  return np_kernel_ref(phi_q, phi_k, v, key_padding, causal, eps=EPS)


def inputs(seed=0, b=2, l=10, h=2, d=4, dv=3, dtype=jnp.float32, scale=1.0):
  """q, k, v drawn with NumPy (no JAX compilation)."""
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, l, h, d)) * scale
  k = rng.normal(size=(b, l, h, d)) * scale
  v = rng.normal(size=(b, l, h, dv))
  return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


# ---------------------------------------------------------------------------
# Against the reference.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('feature_map', FEATURE_MAPS)
@pytest.mark.parametrize('causal', [False, True])
def test_linear_matches_reference(x64, feature_map, causal):
  q, k, v = inputs(dtype=jnp.float64)
  # Non-causal: key padding [b, k]; causal: a flax-style 4-D mask.
  mask = PAD if not causal else jnp.asarray(PAD)[:, None, None, :]
  out = jax.jit(
    functools.partial(linear.linear_attention, causal=causal, feature_map=feature_map, chunk_size=4)
  )(q, k, v, mask)
  assert out.dtype == jnp.float64 and out.shape == v.shape
  ref = np_linear_ref(q, k, v, feature_map, key_padding=PAD, causal=causal)
  np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)


def test_cross_attention_lengths(x64):
  q, _, _ = inputs(l=5, dtype=jnp.float64)
  _, k, v = inputs(seed=1, l=10, dtype=jnp.float64)
  out = jax.jit(linear.linear_attention)(q, k, v, PAD)
  np.testing.assert_allclose(out, np_linear_ref(q, k, v, 'elu', PAD), rtol=1e-10)
  with pytest.raises(ValueError, match='q_length == kv_length'):
    linear.linear_attention(q, k, v, causal=True)


# ---------------------------------------------------------------------------
# Chunked parallel form == recurrent form == reference.
# ---------------------------------------------------------------------------


def run_steps(step_fn, state, q, k, v):
  q, k, v = (np.asarray(x) for x in (q, k, v))  # NumPy slices: no compile per token
  outs = []
  for t in range(q.shape[1]):
    state, out_t = step_fn(state, q[:, t], k[:, t], v[:, t])
    outs.append(out_t)
  return state, np.stack(outs, axis=1)


@pytest.mark.parametrize(
  'feature_map,chunks',
  [('elu', (1, 3, 7, 16)), ('relu', (4,)), ('identity', (3, 16)), ('taylor', (3,))],
)
def test_chunked_causal_equals_recurrent(x64, feature_map, chunks):
  q, k, v = inputs(dtype=jnp.float64)
  b, l, h, d = q.shape
  ref = np_linear_ref(q, k, v, feature_map, causal=True)
  step = jax.jit(functools.partial(linear.linear_attention_step, feature_map=feature_map))
  f = feature_maps.feature_dim(feature_map, d)  # taylor: 1 + d + d^2
  state0 = linear.init_kernel_state(b, h, f, v.shape[-1], jnp.float64)
  final, rec = run_steps(step, state0, q, k, v)
  np.testing.assert_allclose(rec, ref, rtol=1e-10, atol=1e-12)
  for chunk in chunks:  # 3, 4 and 7 do not divide 10; 16 > length
    par, state = jax.jit(
      functools.partial(
        linear.linear_attention,
        causal=True,
        feature_map=feature_map,
        chunk_size=chunk,
        return_state=True,
      )
    )(q, k, v)
    np.testing.assert_allclose(par, rec, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state.s, final.s, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state.z, final.z, rtol=1e-10, atol=1e-12)


def test_prefill_then_decode(x64):
  q, k, v = (np.asarray(x) for x in inputs(dtype=jnp.float64))  # NumPy slices: no compiles
  full = np_linear_ref(q, k, v, 'elu', causal=True)
  _, state = jax.jit(
    functools.partial(linear.linear_attention, causal=True, chunk_size=4, return_state=True)
  )(q[:, :6], k[:, :6], v[:, :6])
  outs = []
  step = jax.jit(linear.linear_attention_step)
  for t in range(6, 10):  # the [batch, 1, heads, dim] token layout
    state, out_t = step(state, q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1])
    assert out_t.shape == (2, 1, 2, 3)
    outs.append(out_t)
  np.testing.assert_allclose(np.concatenate(outs, 1), full[:, 6:], rtol=1e-10)


def test_step_key_valid_skips_update(x64):
  q, k, v = inputs(dtype=jnp.float64)
  state = linear.init_kernel_state(2, 2, 4, 3, jnp.float64)
  step = jax.jit(linear.linear_attention_step)  # each step one compiled program
  q, k, v = (np.asarray(x) for x in (q, k, v))
  state, _ = step(state, q[:, 0], k[:, 0], v[:, 0])
  valid = np.array([True, False])
  new, _ = step(state, q[:, 1], k[:, 1] * 1e3, v[:, 1] * 1e3, key_valid=valid)
  np.testing.assert_array_equal(new.s[1], state.s[1])
  assert not np.allclose(new.s[0], state.s[0])


# ---------------------------------------------------------------------------
# Structure: causality, padding, memory.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('feature_map', FEATURE_MAPS)
def test_no_lookahead(feature_map):
  q, k, v = inputs(b=1, l=7, h=1, d=3, dv=2)
  fn = functools.partial(
    linear.linear_attention, causal=True, feature_map=feature_map, chunk_size=3
  )
  assert_no_lookahead(fn, (q, k, v))


@pytest.mark.parametrize('feature_map', FEATURE_MAPS)
@pytest.mark.parametrize('causal', [False, True])
def test_padded_keys_get_zero_weight(feature_map, causal):
  q, k, v = inputs()
  rng = np.random.default_rng(0)
  pad = jnp.asarray(PAD)
  # In NumPy (no compiles), rounded to float32 as jnp.where would.
  k2 = jnp.asarray(np.where(PAD[:, :, None, None], k, rng.normal(size=k.shape) * 1e4), k.dtype)
  v2 = jnp.asarray(np.where(PAD[:, :, None, None], v, rng.normal(size=v.shape) * 1e4), v.dtype)
  fn = functools.partial(
    linear.linear_attention, mask=pad, causal=causal, feature_map=feature_map, chunk_size=4
  )
  vg = value_and_grads(fn)
  out, _ = vg(q, k, v)
  out2, (_, gk, gv) = vg(q, k2, v2)
  np.testing.assert_array_equal(out, out2)
  assert np.all(np.asarray(gk)[1, 6:] == 0) and np.all(np.asarray(gv)[1, 6:] == 0)


def test_causal_memory_has_no_cumsum_tensor():
  """Forward and backward never hold an O(n f dv) tensor (n=512, f=dv=16, c=16)."""
  n, f, dv, c = 512, 16, 16, 16
  q, k, v = (jax.ShapeDtypeStruct((1, n, 1, x), jnp.float32) for x in (f, f, dv))
  fn = functools.partial(linear.linear_attention, causal=True, chunk_size=c)
  loss = lambda q, k, v: jnp.sum(fn(q, k, v) ** 2)
  fwd = pattern_reference.max_intermediate(jax.make_jaxpr(fn)(q, k, v).jaxpr)
  bwd = pattern_reference.max_intermediate(
    jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr
  )
  cumsum_size = n * f * dv
  assert fwd <= n * max(f, dv) and bwd <= n * max(f, dv), (fwd, bwd)
  assert max(fwd, bwd) * 8 <= cumsum_size


# ---------------------------------------------------------------------------
# Numerics.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('feature_map', FEATURE_MAPS)
@pytest.mark.parametrize('causal', [False, True])
def test_finite_outputs_and_gradients(feature_map, causal):
  """bfloat16 inputs with large norms (q, k scaled by 100)."""
  dtype = jnp.bfloat16
  q, k, v = inputs(dtype=dtype, scale=100.0)
  fn = functools.partial(
    linear.linear_attention, mask=PAD, causal=causal, feature_map=feature_map, chunk_size=4
  )
  out, grads = value_and_grads(fn)(q, k, v)
  assert out.dtype == dtype
  assert np.all(np.isfinite(np.asarray(out).astype(np.float32)))
  for g in grads:
    assert g.dtype == dtype and np.all(np.isfinite(np.asarray(g).astype(np.float32)))


def test_bf16_close_to_float32():
  q, k, v = inputs()
  fn = functools.partial(linear.linear_attention, causal=True, chunk_size=4)
  both = lambda q, k, v: (fn(q, k, v), fn(*(x.astype(jnp.bfloat16) for x in (q, k, v))))
  ref, low = jax.jit(both)(q, k, v)  # one compiled program
  np.testing.assert_allclose(low.astype(jnp.float32), ref, atol=5e-2, rtol=5e-2)


def test_relu_all_zero_row_gives_zero():
  q, k, v = inputs()
  q = -jnp.abs(q)  # relu(q) == 0: empty kernel row, den clamped to eps
  out = jax.jit(functools.partial(linear.linear_attention, feature_map='relu'))(q, k, v)
  np.testing.assert_array_equal(out, 0.0)


# ---------------------------------------------------------------------------
# Linen module.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('causal', [False, True])
def test_module_matches_function(causal):
  q, k, v = inputs()
  options = {'feature_map': 'relu', 'chunk_size': 3}
  mod = ea.mechanism_module('linear', causal=causal, options=options)
  variables = jax.jit(mod.init)(jax.random.PRNGKey(0), q, k, v, mask=PAD)
  assert not jax.tree_util.tree_leaves(variables)
  out = jax.jit(mod.apply)(variables, q, k, v, mask=PAD)
  ref = jax.jit(functools.partial(linear.linear_attention, causal=causal, feature_map='relu'))(
    q, k, v, mask=PAD
  )
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
  if causal:
    decl = ea.get_mechanism('linear')
    state = decl.init_state(decl.resolve(options), batch=2, heads=2, head_dim=4, v_dim=3)

    def step(s, *token):  # tokens [b, h, d] -> the module's [b, 1, h, d]
      s, out = mod.apply(variables, *(x[:, None] for x in token), state=s)
      return s, out[:, 0]

    _, rec = run_steps(jax.jit(step), state, q, k, v)
    want = jax.jit(functools.partial(linear.linear_attention, causal=True, feature_map='relu'))(
      q, k, v
    )
    np.testing.assert_allclose(rec, want, rtol=1e-4, atol=1e-5)


def test_module_bad_feature_map():
  q, k, v = inputs()
  with pytest.raises(ValueError, match="feature_map='cos' of mechanism 'linear'.*'elu'"):
    ea.mechanism_module('linear', options={'feature_map': 'cos'}).init(
      jax.random.PRNGKey(0), q, k, v
    )


def test_causal_chunk_size_follows_the_platform(monkeypatch):
  """None picks the platform's chunk (64 CPU, 256 GPU/TPU); the output does not depend on it."""
  from efficient_attn.ops import linear_attention  # pylint: disable=g-import-not-at-top

  assert linear_attention.causal_chunk_size(7) == 7
  for platform, chunk in (('cpu', 64), ('gpu', 256), ('tpu', 256)):
    monkeypatch.setattr(jax, 'default_backend', lambda p=platform: p)
    assert linear_attention.causal_chunk_size() == chunk
  q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (1, 300, 2, 4)) for i in range(3))
  platform_chunk, chunk_7 = jax.jit(  # traced (the chunk picked) under the faked platform
    lambda q, k, v: (
      linear.linear_attention(q, k, v, causal=True),
      linear.linear_attention(q, k, v, causal=True, chunk_size=7),
    )
  )(q, k, v)
  np.testing.assert_allclose(platform_chunk, chunk_7, atol=1e-5)

"""Tests of RFA and Performer attention (tiny shapes, CPU)."""

import functools
import math

import flax.linen as nn
from helpers import PAD
from helpers import assert_no_lookahead
from helpers import np_kernel_ref
from helpers import np_safe
from helpers import value_and_grads
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn.mechanisms import linear
from efficient_attn.mechanisms import performer
from efficient_attn.mechanisms import rfa
from efficient_attn.ops import feature_maps
from efficient_attn.ops.linear_attention import head_rows

EPS = 1e-6


# ---------------------------------------------------------------------------
# NumPy float64 references of the definitions.
# ---------------------------------------------------------------------------


def np_gated_ref(phi_q, phi_k, v, gate, key_padding=None):
  """The RFA-Gate recurrence, token by token."""
  b, l, h, f = phi_q.shape
  s = np.zeros((b, h, f, v.shape[-1]))
  z = np.zeros((b, h, f))
  outs = []
  for t in range(l):
    g = gate[:, t]
    pk, vt = phi_k[:, t], v[:, t]
    if key_padding is not None:
      g = np.where(key_padding[:, t, None], g, 1.0)
      pk = pk * key_padding[:, t, None, None]
    s = g[..., None, None] * s + (1 - g)[..., None, None] * pk[..., :, None] * vt[..., None, :]
    z = g[..., None] * z + (1 - g)[..., None] * pk
    num = np.einsum('bhf,bhfd->bhd', phi_q[:, t], s)
    outs.append(num / np_safe(np.einsum('bhf,bhf->bh', phi_q[:, t], z), EPS)[..., None])
  return np.stack(outs, 1)


def np_rfa_phi(x, w, sigma):
  x = np.asarray(x, np.float64)
  x = x / np.linalg.norm(x, axis=-1, keepdims=True)
  x = x / np.asarray(sigma, np.float64)[..., None]
  wx = x @ np.asarray(w, np.float64).T
  return np.concatenate([np.sin(wx), np.cos(wx)], -1) / math.sqrt(w.shape[0])


def np_favor_phi(x, w):
  """exp(W x - |x|^2 / 2) / sqrt(m) with the d^-1/4 scaling, no stabiliser."""
  x = np.asarray(x, np.float64) * x.shape[-1] ** -0.25
  a = x @ np.asarray(w, np.float64).T - 0.5 * np.sum(x * x, -1, keepdims=True)
  return np.exp(a) / math.sqrt(w.shape[0])


def np_softmax_attention(q, k, v):
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  s = np.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(q.shape[-1])
  p = np.exp(s - s.max(-1, keepdims=True))
  p = p / p.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhd->bqhd', p, v)


def inputs(seed=0, b=2, l=10, h=2, d=4, dv=3, dtype=jnp.float32, scale=1.0):
  """q, k, v and a gate in (0, 1), drawn with NumPy (no JAX compilation)."""
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, l, h, d)) * scale
  k = rng.normal(size=(b, l, h, d)) * scale
  v = rng.normal(size=(b, l, h, dv))
  gate = 1 / (1 + np.exp(-rng.normal(size=(b, l, h)) - 1.0))
  return tuple(jnp.asarray(x, dtype) for x in (q, k, v, gate))


@functools.lru_cache(maxsize=None)
def _big_projection(d, seed):
  return np.asarray(feature_maps.gaussian_projection(jax.random.PRNGKey(seed), 2048, d))


def projection(m=16, d=4, seed=1, dtype=jnp.float32):
  """The first m rows of one cached draw: still a valid block-orthogonal draw
  when d divides m (whole blocks), and it saves compiling one draw per shape."""
  return jnp.asarray(_big_projection(d, seed)[:m], dtype)


# ---------------------------------------------------------------------------
# Against the references.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('causal,sigma', [(False, 1.0), (True, 'per_head')])
def test_rfa_matches_reference(x64, causal, sigma):
  q, k, v, _ = inputs(dtype=jnp.float64)
  w = projection(dtype=jnp.float64)
  sigma = np.array([0.7, 1.3]) if sigma == 'per_head' else sigma
  out = jax.jit(functools.partial(rfa.rfa_attention, causal=causal, chunk_size=4))(
    q, k, v, w, PAD, sigma=jnp.asarray(sigma)
  )
  ref = np_kernel_ref(
    np_rfa_phi(q, w, sigma), np_rfa_phi(k, w, sigma), np.asarray(v), PAD, causal, eps=EPS
  )
  np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-11)


def test_rfa_gated_matches_recurrence_and_steps(x64):
  q, k, v, gate = inputs(dtype=jnp.float64)
  w = projection(dtype=jnp.float64)
  ref = np_gated_ref(
    np_rfa_phi(q, w, 1.0), np_rfa_phi(k, w, 1.0), np.asarray(v), np.asarray(gate), PAD
  )
  for chunk in (3, 16):  # 3 does not divide 10, 16 > length
    out = jax.jit(functools.partial(rfa.rfa_attention, causal=True, chunk_size=chunk))(
      q, k, v, w, PAD, gate=gate
    )
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-11)
  step = jax.jit(rfa.rfa_attention_step)
  state = linear.init_kernel_state(2, 2, 2 * w.shape[0], 3, jnp.float64)
  outs = []
  for t in range(10):
    state, out_t = step(
      state, q[:, t], k[:, t], v[:, t], w, gate_t=gate[:, t], key_valid=jnp.asarray(PAD[:, t])
    )
    outs.append(out_t)
  np.testing.assert_allclose(jnp.stack(outs, 1), ref, rtol=1e-9, atol=1e-11)
  with pytest.raises(ValueError, match='causal'):
    rfa.rfa_attention(q, k, v, w, gate=gate)


@pytest.mark.parametrize('causal', [False, True])
def test_performer_matches_reference(x64, causal):
  q, k, v, _ = inputs(dtype=jnp.float64)
  w = projection(dtype=jnp.float64)
  out = jax.jit(functools.partial(performer.performer_attention, causal=causal, chunk_size=3))(
    q, k, v, w, PAD
  )
  # The reference has no stabilisers at all: they must cancel.
  ref = np_kernel_ref(
    np_favor_phi(q, w),
    np_favor_phi(k, w),
    np.asarray(v),
    PAD,
    causal,
    eps=performer.performer_eps(jnp.float64),
  )
  np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize('causal', [False, True])
def test_performer_rows_one_at_a_time_equal_all_at_once(x64, causal, monkeypatch):
  """The CPU's row loop (linear_attention.LOOP_ROWS) changes the schedule, not the values,
  gradients or prefill state, padding included."""
  del x64
  q, k, v, _ = inputs(dtype=jnp.float64)
  w = projection(dtype=jnp.float64)
  results = {}
  for loop in (False, True):
    monkeypatch.setitem(head_rows.LOOP_ROWS, jax.default_backend(), loop)
    fn = functools.partial(performer.performer_attention, causal=causal, chunk_size=3, mask=PAD)
    results[loop] = (
      value_and_grads(lambda q, k, v: fn(q, k, v, w))(q, k, v),
      fn(q, k, v, w, return_state=True)[1],
    )
  for a, b in zip(jax.tree.leaves(results[False]), jax.tree.leaves(results[True])):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_performer_steps_equal_parallel(x64):
  q, k, v, _ = inputs(dtype=jnp.float64, scale=2.0)
  w = projection(dtype=jnp.float64)
  par = jax.jit(functools.partial(performer.performer_attention, causal=True, chunk_size=4))(
    q, k, v, w
  )
  ref = np_kernel_ref(
    np_favor_phi(q, w),
    np_favor_phi(k, w),
    np.asarray(v),
    causal=True,
    eps=performer.performer_eps(jnp.float64),
  )
  np.testing.assert_allclose(par, ref, rtol=1e-9, atol=1e-11)
  step = jax.jit(performer.performer_attention_step)
  state = linear.init_kernel_state(2, 2, w.shape[0], 3, jnp.float64)
  outs = []
  for t in range(10):
    state, out_t = step(state, q[:, t], k[:, t], v[:, t], w)
    outs.append(out_t)
  np.testing.assert_allclose(jnp.stack(outs, 1), par, rtol=1e-9, atol=1e-11)
  # Prefill 6 tokens in parallel, then decode the rest ([b, 1, h, d] tokens).
  _, state = jax.jit(
    functools.partial(performer.performer_attention, causal=True, return_state=True)
  )(q[:, :6], k[:, :6], v[:, :6], w)
  for t in range(6, 10):
    state, out_t = step(state, q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], w)
    np.testing.assert_allclose(out_t[:, 0], par[:, t], rtol=1e-9, atol=1e-11)


def test_performer_error_shrinks_with_features():
  q, k, v, _ = inputs(b=1, l=16, h=2, d=8, dv=4)
  q, k = q * 0.4, k * 0.4  # the estimator's variance grows like exp(|q + k|^2)
  exact = np_softmax_attention(q, k, v)
  fn = jax.jit(performer.performer_attention)
  errors = []
  for m in (16, 256, 2048):
    errs = []
    for seed in range(8):
      w = projection(m, 8, seed=100 + seed)  # whole blocks of one draw
      approx = np.asarray(fn(q, k, v, w), np.float64)
      errs.append(np.linalg.norm(approx - exact) / np.linalg.norm(exact))
    errors.append(float(np.mean(errs)))
  assert errors[1] < 0.7 * errors[0] and errors[2] < 0.7 * errors[1], errors
  assert errors[2] < 0.05, errors


# ---------------------------------------------------------------------------
# Structure: causality, padding.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('kind', ['rfa', 'rfa_gated', 'performer'])
def test_no_lookahead(kind):
  q, k, v, gate = inputs(b=1, l=7, h=1, d=3, dv=2)
  w = projection(m=8, d=3)
  if kind == 'performer':
    fn = lambda q, k, v: performer.performer_attention(q, k, v, w, causal=True, chunk_size=3)
    assert_no_lookahead(fn, (q, k, v))
  elif kind == 'rfa':
    fn = lambda q, k, v: rfa.rfa_attention(q, k, v, w, causal=True, chunk_size=3)
    assert_no_lookahead(fn, (q, k, v))
  else:
    fn = lambda q, k, v, g: rfa.rfa_attention(q, k, v, w, causal=True, gate=g, chunk_size=3)
    assert_no_lookahead(fn, (q, k, v, gate), past_args=(1, 2, 3))


@pytest.mark.parametrize(
  'kind,causal', [('rfa', False), ('rfa_gated', True), ('performer', False), ('performer', True)]
)
def test_padded_keys_get_zero_weight(kind, causal):
  q, k, v, gate = inputs()
  w = projection()
  pad = jnp.asarray(PAD)
  rng = np.random.default_rng(0)
  k2 = jnp.where(pad[:, :, None, None], k, rng.normal(size=k.shape) * 1e4)
  v2 = jnp.where(pad[:, :, None, None], v, rng.normal(size=v.shape) * 1e4)
  gate2 = jnp.where(pad[..., None], gate, 0.01)
  if kind == 'performer':
    fn = lambda q, k, v, g: performer.performer_attention(q, k, v, w, mask=pad, causal=causal)
  else:
    fn = lambda q, k, v, g: rfa.rfa_attention(
      q, k, v, w, mask=pad, causal=causal, gate=g if kind == 'rfa_gated' else None
    )
  vg = value_and_grads(fn, num_args=4)
  out, _ = vg(q, k, v, gate)
  out2, (_, gk, gv, gg) = vg(q, k2, v2, gate2)
  np.testing.assert_array_equal(out, out2)
  for g in (gk, gv, gg):
    assert np.all(np.asarray(g)[1, 6:] == 0)


# ---------------------------------------------------------------------------
# Numerics.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
  'kind,causal',
  [('rfa', False), ('rfa', True), ('rfa_gated', True), ('performer', False), ('performer', True)],
)
def test_finite_outputs_and_gradients(kind, causal):
  """bfloat16 inputs with large norms (q, k scaled by 100)."""
  q, k, v, gate = inputs(dtype=jnp.bfloat16, scale=100.0)
  w = projection()
  if kind == 'performer':
    fn = lambda q, k, v, g: performer.performer_attention(q, k, v, w, mask=PAD, causal=causal)
  else:
    fn = lambda q, k, v, g: rfa.rfa_attention(
      q, k, v, w, mask=PAD, causal=causal, gate=g if kind == 'rfa_gated' else None
    )
  out, grads = value_and_grads(fn, num_args=4)(q, k, v, gate)
  assert out.dtype == jnp.bfloat16
  assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
  for g in grads:
    assert bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))


def test_bf16_close_to_float32():
  q, k, v, _ = inputs()
  w = projection()
  fn = jax.jit(functools.partial(performer.performer_attention, causal=True))
  ref = fn(q, k, v, w)
  low = fn(*(x.astype(jnp.bfloat16) for x in (q, k, v)), w)
  np.testing.assert_allclose(low.astype(jnp.float32), ref, atol=5e-2, rtol=5e-2)


# ---------------------------------------------------------------------------
# Linen modules and the redraw policy.
# ---------------------------------------------------------------------------


class Two(nn.Module):
  """Two mechanisms in one model, to check per-layer draws."""

  cls: type
  kwargs: dict

  @nn.compact
  def __call__(self, q, k, v, deterministic=True):
    a = self.cls(name='first', **self.kwargs)(q, k, v, deterministic=deterministic)
    b = self.cls(name='second', **self.kwargs)(q, k, v, deterministic=deterministic)
    return a, b


def test_performer_fixed_features_and_redraw():
  q, k, v, _ = inputs()
  key = jax.random.PRNGKey(0)
  model = Two(
    ea.Mechanism, dict(mechanism='performer', options=dict(num_features=32, redraw=True, seed=3))
  )
  variables = jax.jit(model.init)(key, q, k, v)
  assert not jax.tree_util.tree_leaves(variables)  # no state for the features
  apply = jax.jit(model.apply, static_argnames='deterministic')
  a, b = apply(variables, q, k, v)
  # Fixed per layer: PRNGKey(seed) folded with crc32 of the path.
  w = feature_maps.gaussian_projection(feature_maps.fixed_feature_rng(3, ('first',)), 32, 4)
  np.testing.assert_allclose(
    a, jax.jit(performer.performer_attention)(q, k, v, w), rtol=1e-5, atol=1e-6
  )
  assert not np.allclose(a, b)  # each layer its own draw
  a2, _ = apply(variables, q, k, v)  # deterministic across calls
  np.testing.assert_array_equal(a, a2)
  # Training without a 'features' rng: still the fixed draw.
  np.testing.assert_array_equal(apply(variables, q, k, v, deterministic=False)[0], a)
  # Training with a 'features' rng: fresh features, different per key.
  r1, _ = apply(variables, q, k, v, deterministic=False, rngs={'features': key})
  r2, _ = apply(variables, q, k, v, deterministic=False, rngs={'features': jax.random.PRNGKey(1)})
  assert not np.allclose(r1, a) and not np.allclose(r1, r2)
  # Evaluation ignores the rng.
  np.testing.assert_array_equal(apply(variables, q, k, v, rngs={'features': key})[0], a)
  # redraw=False ignores it even in training.
  fixed = Two(ea.Mechanism, dict(mechanism='performer', options=dict(num_features=32, seed=3)))
  fixed_apply = jax.jit(functools.partial(fixed.apply, deterministic=False))
  np.testing.assert_allclose(
    fixed_apply(variables, q, k, v, rngs={'features': key})[0], a, rtol=1e-5, atol=1e-7
  )


def _stepper(mod, variables):
  """jit(state, q_t, k_t, v_t) -> (state, out_t) of a Mechanism module, tokens [b, 1, h, d]."""
  return jax.jit(lambda s, *token: mod.apply(variables, *token, state=s))


def _empty_state(name, **options):
  decl = ea.get_mechanism(name)
  return decl.init_state(decl.resolve(options), batch=2, heads=2, head_dim=4, v_dim=3)


def test_rfa_module_gate_sigma_and_step():
  q, k, v, _ = inputs()
  options = dict(num_features=8, use_gate=True, learn_sigma=True, sigma=0.8, chunk_size=4)
  mod = ea.mechanism_module('rfa', causal=True, options=options)
  variables = jax.jit(mod.init)(jax.random.PRNGKey(0), q, k, v)
  shapes = jax.tree_util.tree_map(jnp.shape, variables['params'])
  assert shapes == {'gate_kernel': (4, 2), 'gate_bias': (2,), 'log_sigma': (2,)}
  np.testing.assert_allclose(jnp.exp(variables['params']['log_sigma']), 0.8, rtol=1e-6)
  out = jax.jit(mod.apply)(variables, q, k, v)
  assert out.shape == v.shape and bool(jnp.all(jnp.isfinite(out)))
  step = _stepper(mod, variables)
  state = _empty_state('rfa', **options)
  outs = []
  for t in range(10):
    state, out_t = step(state, q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1])
    outs.append(out_t[:, 0])
  np.testing.assert_allclose(jnp.stack(outs, 1), out, rtol=1e-4, atol=1e-5)
  # Gradients reach the gate and sigma.
  g = jax.jit(jax.grad(lambda p: jnp.sum(mod.apply({'params': p}, q, k, v) ** 2)))(
    variables['params']
  )
  assert all(float(jnp.max(jnp.abs(x))) > 0 for x in jax.tree_util.tree_leaves(g))
  with pytest.raises(ValueError, match='use_gate=True.*causal'):
    ea.mechanism_module('rfa', options={'use_gate': True}).init(jax.random.PRNGKey(0), q, k, v)


def test_performer_module_step_and_mask():
  q, k, v, _ = inputs()
  options = dict(num_features=16, chunk_size=3)
  mod = ea.mechanism_module('performer', causal=True, options=options)
  variables = jax.jit(mod.init)(jax.random.PRNGKey(0), q, k, v)
  out = jax.jit(mod.apply)(variables, q, k, v)
  step = _stepper(mod, variables)
  state = _empty_state('performer', **options)
  for t in range(10):
    state, out_t = step(state, q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1])
    np.testing.assert_allclose(out_t[:, 0], out[:, t], rtol=1e-4, atol=1e-5)
  masked = jax.jit(ea.mechanism_module('performer', options={'num_features': 16}).apply)(
    {}, q, k, v, mask=PAD[:, None, None, :]
  )
  assert masked.shape == v.shape and bool(jnp.all(jnp.isfinite(masked)))

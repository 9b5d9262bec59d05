"""RWKV-7 (Peng et al. 2025): the naive, chunkwise (WY) and decoding forms of the layer's
mechanism equal a float64 NumPy transcription of flash-linear-attention's RWKV7Attention
(token shift on and off), gradients included; decoding 256 tokens equals the parallel
form; with no decay and no in-context rate the recurrence is causal linear attention; a
bfloat16 layer stays close to the float32 one; the pure function refuses in one line."""

import functools

import gated_helpers as gh
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.layers import multi_head as layer_lib

OPTIONS = {'chunk_size': 4, 'decay_rank': 3, 'a_rank': 2, 'gate_rank': 5}


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _l2(x):
  return x / np.sqrt(np.sum(x * x, -1, keepdims=True) + 1e-6)


def _dplr_recurrence(r, w, k, v, kappa, a):
  """One head `[n, d]`: S_t = S_{t-1} (diag(w_t) - kappa_t^T (a_t kappa_t)) + v_t^T k_t in
  the paper's orientation (S `[dv, dk]`), o_t = S_t r_t."""
  n, dk = r.shape
  s, out = np.zeros((v.shape[-1], dk)), np.zeros(v.shape)
  for t in range(n):
    transition = np.diag(w[t]) - np.outer(kappa[t], a[t] * kappa[t])
    s = s @ transition + np.outer(v[t], k[t])
    out[t] = s @ r[t]
  return out


def rwkv7_reference(p, q, k, v, x, token_shift=True):
  """fla's RWKV7Attention after its projections (float64 NumPy): lerps with the token
  before, the LoRAs, the keys, the recurrence, the group norm, the bonus and the gate."""
  prev = lambda y: np.concatenate([np.zeros_like(y[:, :1]), y[:, :-1]], axis=1)
  lerp = lambda y, mu: y + (prev(y) - y) * mu if token_shift else y
  xw, xa, xg = (lerp(x, p.get(f'mu_{n}')) for n in ('decay', 'a', 'gate'))
  r, k, v = (lerp(y, p.get(f'mu_{n}')) for y, n in zip((q, k, v), 'rkv'))
  up = lambda y, n: np.einsum('bnr,rhd->bnhd', y, p[f'{n}_up'])
  w = np.exp(-np.exp(-0.5) * _sigmoid(p['decay_bias'] + up(np.tanh(xw @ p['decay_down']), 'decay')))
  a = _sigmoid(p['a_bias'] + up(xa @ p['a_down'], 'a'))
  g = up(_sigmoid(xg @ p['gate_down']), 'gate')
  kappa = _l2(k * p['k_k'])
  k = k * (1 + (a - 1) * p['k_a'])
  o = gh.per_head(_dplr_recurrence, r, w, k, v, kappa, a)
  centred = o - o.mean(-1, keepdims=True)
  o = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5 * o.shape[-1])
  o = o * p['norm_scale'] + p['norm_bias']
  return (o + np.sum(r * k * p['r_k'], -1, keepdims=True) * v) * g


def _run(options, params, q, k, v, x, state=None):
  """The layer's mechanism on projected q, k, v and the layer input x (a decoding call of
  all the tokens from `state` where one is given: `prefill`, a scan of `step`)."""
  decl = ea.get_mechanism('rwkv7')
  return layer_lib.run_mechanism(
    decl,
    decl.resolve(options),
    params,
    q,
    k,
    v,
    mask=None,
    causal=True,
    ctx=registry.Context(),
    use_rotary=False,
    inputs=x,
    head_dim=q.shape[-1],
    state=state,
  )


def _inputs(n, options, seed=0, b=2, h=2, d=4, features=6):
  """float64 params (fla's initialisers plus noise) and q, k, v, x."""
  rng = np.random.default_rng(seed)
  q, k, v = (rng.standard_normal((b, n, h, d)) for _ in range(3))
  x = rng.standard_normal((b, n, features))
  return gh.random_params('rwkv7', options, h, d, features, seed), q, k, v, x


def _decoded(options, params, q, k, v, x):
  decl = ea.get_mechanism('rwkv7')
  state = decl.init_state(
    decl.resolve(options), batch=q.shape[0], heads=q.shape[2], head_dim=q.shape[3], v_dim=4
  )
  return _run(options, params, q, k, v, x, state)[1]


@pytest.mark.parametrize('token_shift', [True, False])
def test_three_forms_equal_the_definition(token_shift):
  """Chunk and naive forms and decoding (float32) equal the NumPy definition at 13 tokens
  (chunks of 4, the last one short); with token shift, the chunk form's gradients (float32)
  equal the naive form's in float64, for q, k, v, the layer input and every parameter."""
  options = {**OPTIONS, 'token_shift': token_shift}
  params, q, k, v, x = _inputs(13, options)
  want = rwkv7_reference(params, q, k, v, x, token_shift=token_shift)
  f32 = lambda a: jax.tree.map(lambda t: jnp.asarray(t, jnp.float32), a)
  forms = {
    'chunk': jax.jit(functools.partial(_run, options)),
    'naive': jax.jit(functools.partial(_run, {**options, 'form': 'naive'})),
    'decode': jax.jit(functools.partial(_decoded, options)),
  }
  for name, form in forms.items():
    got = form(*f32((params, q, k, v, x)))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4, err_msg=name)
  if not token_shift:
    return
  cotangent = np.random.default_rng(1).standard_normal(want.shape)
  loss = lambda opts, *a: jnp.sum(_run(opts, *a) * cotangent.astype(a[1].dtype))
  grad = lambda opts: jax.jit(jax.grad(functools.partial(loss, opts), argnums=(0, 1, 2, 3, 4)))
  got = grad(options)(*f32((params, q, k, v, x)))
  with jax.enable_x64(True):
    f64 = jax.tree.map(jnp.asarray, (params, q, k, v, x))
    want = jax.tree.map(np.asarray, grad({**options, 'form': 'naive'})(*f64))
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    scale = max(1.0, float(np.abs(w).max()))
    np.testing.assert_allclose(
      g, w, atol=2e-4 * scale, rtol=1e-3, err_msg=jax.tree_util.keystr(path)
    )


def test_decoding_256_tokens_equals_the_parallel_form():
  """256 decoding steps (the token shift's history and the state carried; `prefill`'s scan
  of `step`) against the chunk form, width 2 heads of 4, float32."""
  options = {**OPTIONS, 'chunk_size': 16}
  f32 = lambda a: jax.tree.map(lambda t: jnp.asarray(t, jnp.float32), a)
  args = f32(_inputs(256, options, seed=1, b=1))
  chunk = jax.jit(functools.partial(_run, options))(*args)
  steps = jax.jit(functools.partial(_decoded, options))(*args)
  scale = float(jnp.abs(chunk).max())
  np.testing.assert_allclose(steps, chunk, atol=2e-5 * scale, rtol=1e-4)


def test_without_decay_or_removal_it_is_causal_linear_attention():
  """log w = 0 and alpha = 0: S_t = S_{t-1} + k_t v_t^T, o_t = sum_{s <= t} (r_t . k_s) v_s,
  in both forms, whatever the removal key; a removal with alpha = 1 along a unit kappa
  orthogonal to every key changes nothing either."""
  rng = np.random.default_rng(2)
  b, n, h, d = 2, 11, 2, 4
  r, k, v, kappa = (rng.standard_normal((b, n, h, d)) for _ in range(4))
  want = np.einsum('bthd,bshd,ts,bshv->bthv', r, k, np.tril(np.ones((n, n))), v)
  zeros = np.zeros((b, n, h, d))
  # kappa = e_0 and keys without a first feature: the removal never touches what was written
  k_perp, e0 = k.copy(), np.zeros((b, n, h, d))
  k_perp[..., 0], e0[..., 0] = 0.0, 1.0
  want_perp = np.einsum('bthd,bshd,ts,bshv->bthv', r, k_perp, np.tril(np.ones((n, n))), v)
  with jax.enable_x64(True):
    for form in ('chunk', 'naive'):
      run = jax.jit(functools.partial(ea.mechanisms.rwkv7_attention, form=form, chunk_size=4))
      np.testing.assert_allclose(run(r, k, v, zeros, kappa, zeros), want, atol=1e-10)
      np.testing.assert_allclose(
        run(r, k_perp, v, zeros, e0, np.ones((b, n, h, d))), want_perp, atol=1e-10
      )


def test_a_bfloat16_layer_stays_close_to_the_float32_layer():
  layer = ea.MultiHeadAttention(num_heads=2, mechanism='rwkv7', causal=True, options=OPTIONS)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 8))
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  variables = jax.tree.map(  # LoRAs start at 0 in fla: move them so the gates vary
    lambda a: a + 0.3 * jax.random.normal(jax.random.PRNGKey(2), a.shape), variables
  )
  want = jax.jit(layer.apply)(variables, x)
  got = jax.jit(layer.clone(dtype=jnp.bfloat16).apply)(variables, x.astype(jnp.bfloat16))
  assert got.dtype == jnp.bfloat16
  error = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)) / jnp.max(jnp.abs(want)))
  assert error < 3e-2, error


def test_a_bad_call_is_one_line_naming_the_function():
  r = jnp.zeros((1, 5, 2, 4))
  with pytest.raises(ValueError, match=r'rwkv7_attention: rate of shape \(1, 5, 2, 3\)') as e:
    ea.mechanisms.rwkv7_attention(r, r, r, r, r, r[..., :3])
  assert '\n' not in str(e.value)
  with pytest.raises(ValueError, match="rwkv7_attention: form='fast' is not valid"):
    ea.mechanisms.rwkv7_attention(r, r, r, r, r, r, form='fast')
  assert ea.mechanisms.pure_function('rwkv7') is ea.mechanisms.rwkv7_attention

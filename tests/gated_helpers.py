"""Float64 NumPy recurrences of the gated linear attentions, and the three-forms check.

The references are the definitions, one token at a time:
  decay: S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T;
  delta: S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T;
and o_t = S_t^T q_t. `check_three_forms` compares a registered mechanism's naive
recurrence, chunkwise form and decoding step with its float64 NumPy reference,
forward and gradients (the gradients against the naive form run in float64).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.layers import multi_head as layer_lib


def decay_recurrence(q, k, v, g):
  """q, k `[n, dk]`, v `[n, dv]`, g `[n, 1 or dk]` (log-decays) -> o `[n, dv]` (float64)."""
  s = np.zeros((k.shape[1], v.shape[1]))
  out = []
  for t in range(q.shape[0]):
    s = np.exp(g[t])[:, None] * s + np.outer(k[t], v[t])
    out.append(s.T @ q[t])
  return np.stack(out)


def delta_recurrence(q, k, v, beta, g=None):
  """The (gated) delta rule; beta `[n]`, g `[n, 1]` or None -> o `[n, dv]` (float64)."""
  s = np.zeros((k.shape[1], v.shape[1]))
  out = []
  for t in range(q.shape[0]):
    a = 1.0 if g is None else np.exp(g[t, 0])
    s = a * (s - beta[t] * np.outer(k[t], k[t] @ s)) + beta[t] * np.outer(k[t], v[t])
    out.append(s.T @ q[t])
  return np.stack(out)


def per_head(fn, *arrays):
  """fn applied to each (batch, head) of `[b, n, h, ...]` arrays -> `[b, n, h, dv]`."""
  b, _, h = arrays[0].shape[:3]
  return np.stack(
    [np.stack([fn(*(a[i, :, j] for a in arrays)) for j in range(h)], 1) for i in range(b)]
  )


def causal_conv(x, w):
  """NumPy depthwise causal convolution: x `[b, n, h, d]`, w `[K, h, d]`."""
  size, n = w.shape[0], x.shape[1]
  xp = np.pad(x, [(0, 0), (size - 1, 0), (0, 0), (0, 0)])
  return sum(w[i] * xp[:, i : i + n] for i in range(size))


def silu(x):
  return x / (1.0 + np.exp(-x))


def rms_norm(x, axes=(-1,), eps=1e-5):
  return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)


def random_params(mechanism, options, heads, head_dim, features, seed=0):
  """The mechanism's declared parameters as float64 NumPy arrays: its own initialisers
  (the papers' values: decays, dt, A), plus noise so no gate sits at a special value."""
  decl = ea.get_mechanism(mechanism)
  resolved = decl.resolve(options)
  specs = layer_lib.declared_params(
    decl, resolved, heads=heads, head_dim=head_dim, max_length=None, causal=True, features=features
  )
  rng = np.random.default_rng(seed)
  out = {}
  for i, (name, (shape, init)) in enumerate(sorted(specs.items())):
    value = np.asarray(init(jax.random.PRNGKey(i), shape, jnp.float32), np.float64)
    out[name] = value + 0.1 * rng.standard_normal(shape)
  return out


def _forms(mechanism, options, params, q, k, v, x, head_dim):
  """(chunk output, naive output, step-by-step output) in the inputs' dtype."""
  decl = ea.get_mechanism(mechanism)
  run = lambda form, *a: layer_lib.run_mechanism(
    decl,
    decl.resolve({**options, 'form': form}),
    a[0],
    *a[1:4],
    mask=None,
    causal=True,
    ctx=registry.Context(),
    use_rotary=False,
    inputs=a[4],
    head_dim=head_dim,
  )
  # Each form one compiled program: run eagerly, every operation would compile alone.
  chunk = jax.jit(functools.partial(run, 'chunk'))(params, q, k, v, x)
  naive = jax.jit(functools.partial(run, 'naive'))(params, q, k, v, x)
  resolved = decl.resolve(options)
  state = decl.init_state(
    resolved, batch=q.shape[0], heads=v.shape[2], head_dim=q.shape[3], v_dim=v.shape[3]
  )

  @jax.jit
  def step(state, q_t, k_t, v_t, x_t):
    return layer_lib.run_mechanism(
      decl,
      resolved,
      params,
      q_t,
      k_t,
      v_t,
      mask=None,
      causal=True,
      ctx=registry.Context(),
      use_rotary=False,
      state=state,
      inputs=x_t,
      head_dim=head_dim,
    )

  outs = []
  for t in range(q.shape[1]):
    state, y = step(state, *(a[:, t : t + 1] for a in (q, k, v, x)))
    outs.append(y)
  return chunk, naive, jnp.concatenate(outs, axis=1)


def check_three_forms(
  mechanism, reference, options, *, length, heads=2, head_dim=4, features=6, seed=0, atol=2e-5
):
  """Naive, chunkwise and step forms of `mechanism` (float32) equal `reference(params, q, k,
  v, x)` (float64 NumPy) at `length`; gradients of the chunkwise form (float32) equal the
  naive form's in float64, for q, k, v, the layer input and every parameter. q, k and v
  have the head shapes the options declare (`Mechanism.head_shapes`) for `heads` heads of
  `head_dim`."""
  rng = np.random.default_rng(seed)
  b = 2
  decl = ea.get_mechanism(mechanism)
  qk_heads, qk_dim, v_dim = decl.head_shapes(decl.resolve(options), heads=heads, head_dim=head_dim)
  q, k = (rng.standard_normal((b, length, qk_heads, qk_dim)) for _ in range(2))
  v = rng.standard_normal((b, length, heads, v_dim))
  x = rng.standard_normal((b, length, features))
  params = random_params(mechanism, options, heads, head_dim, features, seed)
  want = reference(params, q, k, v, x)
  f32 = lambda a: jax.tree.map(lambda t: jnp.asarray(t, jnp.float32), a)
  got = _forms(mechanism, options, f32(params), *f32((q, k, v, x)), head_dim)
  for name, out in zip(('chunk', 'naive', 'step'), got):
    np.testing.assert_allclose(out, want, atol=atol, rtol=1e-4, err_msg=f'{mechanism} {name}')

  cotangent = rng.standard_normal(want.shape)

  def loss(form, params, q, k, v, x):
    out = layer_lib.run_mechanism(
      decl,
      decl.resolve({**options, 'form': form}),
      params,
      q,
      k,
      v,
      mask=None,
      causal=True,
      ctx=registry.Context(),
      use_rotary=False,
      inputs=x,
      head_dim=head_dim,
    )
    return jnp.sum(out * cotangent.astype(out.dtype))

  grad = functools.partial(jax.grad(loss, argnums=(1, 2, 3, 4, 5)), 'chunk')
  got = jax.jit(grad)(*f32((params, q, k, v, x)))
  with jax.enable_x64(True):
    f64 = lambda a: jax.tree.map(lambda t: jnp.asarray(t, jnp.float64), a)
    want = jax.jit(jax.grad(functools.partial(loss, 'naive'), argnums=(0, 1, 2, 3, 4)))(
      *f64((params, q, k, v, x))
    )
    want = jax.tree.map(np.asarray, want)
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    scale = max(1.0, float(np.abs(w).max()))
    np.testing.assert_allclose(
      g,
      w,
      atol=atol * 10 * scale,
      rtol=1e-3,
      err_msg=f'{mechanism} gradient {jax.tree_util.keystr(path)}',
    )

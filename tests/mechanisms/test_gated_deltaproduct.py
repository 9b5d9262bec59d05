"""Gated DeltaProduct (Siems et al. 2025): n_h delta steps a token on the delta rule's forms.

One Householder step is Gated DeltaNet, parameters, outputs and gradients; with two, the
layer's three forms, the pure function on padded and packed rows, a long decode, a
bfloat16 layer and the Pallas kernels equal float64 definitions written here token by
token (or the XLA form)."""

import gated_helpers as gh
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.layers import multi_head as layer_lib
from efficient_attn.mechanisms import gated_deltaproduct
from efficient_attn.ops import delta
from efficient_attn.ops.delta import product

F32 = lambda a: jax.tree.map(lambda t: jnp.asarray(t, jnp.float32), a)
sigmoid = lambda x: 1.0 / (1.0 + np.exp(-x))


def l2(a):
  return a / np.sqrt(np.sum(a * a, -1, keepdims=True) + 1e-6)


def householder_products(q, k, v, beta, g=None, ids=None):
  """The definition, float64, one (row, head): q `[n, dk]`, k `[n, n_h, dk]`, v `[n, n_h,
  dv]`, beta `[n, n_h]`, g `[n]` or None, ids `[n]` (0: padding; a new id starts from
  S = 0) -> o `[n, dv]`. Token t: S = a_t S, then S = (I - beta k k^T) S + beta k v^T for
  each of its n_h steps in order, o_t = S^T q_t."""
  s = np.zeros((k.shape[-1], v.shape[-1]))
  out, last = np.zeros((q.shape[0], v.shape[-1])), None
  for t in range(q.shape[0]):
    if ids is not None and ids[t] == 0:
      continue
    if ids is not None and last is not None and ids[t] != last:
      s = np.zeros_like(s)
    last = None if ids is None else ids[t]
    s = s * (1.0 if g is None else np.exp(g[t]))
    for j in range(k.shape[1]):
      kj = k[t, j]
      s = s - beta[t, j] * np.outer(kj, kj @ s) + beta[t, j] * np.outer(kj, v[t, j])
    out[t] = s.T @ q[t]
  return out


def layer_reference(p, q, k, v, x, n_h=2):
  """The layer's Gated DeltaProduct (fla's GatedDeltaProduct, allow_neg_eigval), float64:
  the further steps' keys and values projected from x beside the layer's, one convolution
  and SiLU over every step's, L2 norms, beta = 2 sigmoid, then RMSNorm and the swish gate."""
  dense = lambda name: np.einsum('bnf,fhd->bnhd', x, p[name])
  k = np.concatenate([k, dense('keys_kernel')], -1)
  v = np.concatenate([v, dense('values_kernel')], -1)
  q, k, v = (gh.silu(gh.causal_conv(a, p[f'{n}_conv'])) for a, n in zip((q, k, v), 'qkv'))
  steps = lambda a: a.reshape(a.shape[:3] + (n_h, -1))
  q, k, v = l2(q) / np.sqrt(q.shape[-1]), l2(steps(k)), steps(v)
  beta = 2 * sigmoid(np.concatenate([(x @ p['beta_kernel'])[..., None], dense('betas_kernel')], -1))
  g = -np.exp(p['A_log']) * np.logaddexp(0.0, x @ p['decay_kernel'] + p['dt_bias'])
  out = gh.per_head(householder_products, q, k, v, beta, g)
  gate = gh.silu(np.einsum('bnf,fhd->bnhd', x, p['gate_kernel']))
  return gh.rms_norm(out) * p['norm_scale'] * gate


def run(name, options, params, q, k, v, x, state=None):
  decl = ea.get_mechanism(name)
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


def test_substeps_interleave_and_read_out_by_token():
  b, n, h, n_h = 1, 3, 1, 2
  token = jnp.arange(n, dtype=jnp.float32)[None, :, None, None] + 1  # [b, n, h, 1]
  k = token[..., None, :] * 10 + jnp.arange(n_h, dtype=jnp.float32)[:, None]  # [b, n, h, n_h, 1]
  beta = k[..., 0]
  q, k2, v, g, beta2, ids = product.interleave(token, k, k, token, beta, jnp.asarray([[1, 1, 2]]))
  assert q.shape == (b, n * n_h, h, 1) and beta2.shape == (b, n * n_h, h)
  np.testing.assert_array_equal(q[0, :, 0, 0], [0, 1, 0, 2, 0, 3])  # read at the last step
  np.testing.assert_array_equal(g[0, :, 0, 0], [1, 0, 2, 0, 3, 0])  # decay at the first
  np.testing.assert_array_equal(k2[0, :, 0, 0], [10, 11, 20, 21, 30, 31])
  np.testing.assert_array_equal(v, k2)
  np.testing.assert_array_equal(beta2[0, :, 0], [10, 11, 20, 21, 30, 31])
  np.testing.assert_array_equal(ids, [[1, 1, 1, 1, 2, 2]])
  np.testing.assert_array_equal(product.read_out(k2, n_h)[0, :, 0, 0], [11, 21, 31])


def test_one_householder_step_is_gated_deltanet():
  """num_householder=1 without negative eigenvalues: Gated DeltaNet's parameters (names and
  shapes), outputs and gradients, bit for bit."""
  options = {'num_householder': 1, 'allow_neg_eigval': False, 'chunk_size': 4}
  heads, dim, features, n = 2, 4, 6, 10
  make = lambda name: layer_lib.declared_params(
    ea.get_mechanism(name),
    ea.get_mechanism(name).resolve(options if name != 'gated_deltanet' else {}),
    heads=heads,
    head_dim=dim,
    max_length=None,
    causal=True,
    features=features,
  )
  specs, want_specs = make('gated_deltaproduct'), make('gated_deltanet')
  assert {k: s.shape for k, s in specs.items()} == {k: s.shape for k, s in want_specs.items()}
  params = F32(gh.random_params('gated_deltanet', {}, heads, dim, features))
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.standard_normal((2, n, heads, dim)), jnp.float32) for _ in range(3))
  x = jnp.asarray(rng.standard_normal((2, n, features)), jnp.float32)
  loss = lambda name, opts, *a: jnp.sum(jnp.sin(run(name, opts, *a)))
  grad = lambda name, opts: jax.value_and_grad(loss, argnums=range(2, 7))(
    name, opts, params, q, k, v, x
  )
  got = jax.jit(lambda: grad('gated_deltaproduct', options))()
  want = jax.jit(lambda: grad('gated_deltanet', {'chunk_size': 4}))()
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize('length', [13])
def test_two_steps_three_forms_equal_the_definition(length):
  """Chunk (4 tokens, 8 substeps), naive and step forms of the layer equal the float64
  definition over several chunks, and the chunk form's gradients the naive form's."""
  gh.check_three_forms('gated_deltaproduct', layer_reference, {'chunk_size': 4}, length=length)


def _pure_inputs(n=14, b=2, h=2, n_h=2, dk=4, dv=3, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((b, n, h, dk))
  k = rng.standard_normal((b, n, h, n_h, dk))
  v = rng.standard_normal((b, n, h, n_h, dv))
  beta = 2 * rng.uniform(0.05, 0.95, (b, n, h, n_h))  # negative eigenvalues too
  g = -rng.uniform(0.0, 0.5, (b, n, h))
  return q, k, v, beta, g


IDS = np.array(
  [[0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2], [3, 3, 3, 3, 3, 3, 0, 0, 4, 4, 4, 4, 4, 5]]
)


@pytest.mark.parametrize('form', ['chunk', 'naive'])
def test_the_pure_function_on_padded_packed_rows_equals_the_definition(form):
  q, k, v, beta, g = _pure_inputs()
  attend = jax.jit(
    gated_deltaproduct.gated_deltaproduct_attention, static_argnames=['form', 'chunk_size']
  )
  got = attend(*F32((q, k, v, beta, g)), segment_ids=jnp.asarray(IDS), form=form, chunk_size=4)
  ref = lambda q, k, v, beta, g, ids: householder_products(
    l2(q) / np.sqrt(q.shape[-1]), l2(k), v, beta, g, ids
  )
  ids = np.broadcast_to(IDS[:, :, None], g.shape)
  want = gh.per_head(ref, q, k, v, beta, g, ids)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_a_bad_shape_is_one_line():
  q, k, v, beta, g = F32(_pure_inputs(n=5))
  attend = gated_deltaproduct.gated_deltaproduct_attention
  for call, message in (
    (lambda: attend(q, k[..., 0, :], v, beta, g), 'gated_deltaproduct_attention: k [2, 5, 2, 4]'),
    (lambda: attend(q, k, v, beta[..., 0], g), 'gated_deltaproduct_attention: beta of shape'),
    (lambda: attend(q, k, v[:, :, :, :1], beta, g), 'gated_deltaproduct_attention: v of shape'),
  ):
    with pytest.raises(ValueError) as e:
      call()
    assert str(e.value).startswith(message) and '\n' not in str(e.value), e.value


def test_decoding_equals_the_parallel_form_over_hundreds_of_steps():
  """300 decoding steps (a lax.scan of `step`, two delta steps each) equal the chunk form."""
  n, heads, dim, features = 300, 1, 2, 3
  options = {'chunk_size': 16}
  params = F32(gh.random_params('gated_deltaproduct', options, heads, dim, features))
  rng = np.random.default_rng(2)
  q, k, v = F32([rng.standard_normal((1, n, heads, dim)) for _ in range(3)])
  x = F32(rng.standard_normal((1, n, features)))
  want = jax.jit(lambda *a: run('gated_deltaproduct', options, *a))(params, q, k, v, x)
  decl = ea.get_mechanism('gated_deltaproduct')
  state = decl.init_state(decl.resolve(options), batch=1, heads=heads, head_dim=dim, v_dim=dim)

  @jax.jit
  def decode(state, q, k, v, x):
    def body(state, token):
      return run('gated_deltaproduct', options, params, *token, state=state)

    tokens = tuple(jnp.moveaxis(a, 1, 0)[:, :, None] for a in (q, k, v, x))
    _, out = jax.lax.scan(body, state, tokens)
    return jnp.moveaxis(out[:, :, 0], 0, 1)

  got = decode(state, q, k, v, x)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_a_bfloat16_layer_stays_close_to_float32():
  layer = ea.MultiHeadAttention(
    num_heads=2, mechanism='gated_deltaproduct', causal=True, options={'chunk_size': 8}
  )
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 24, 16))
  variables = layer.init(jax.random.PRNGKey(1), x)
  want = jax.jit(layer.apply)(variables, x)
  got = jax.jit(layer.clone(dtype=jnp.bfloat16).apply)(variables, x.astype(jnp.bfloat16))
  assert got.dtype == jnp.bfloat16
  error = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)) / jnp.max(jnp.abs(want)))
  assert error < 3e-2, error


def test_the_pallas_kernels_equal_the_xla_form():
  """The product wrapped around the Pallas kernels (interpreted on a CPU) equals it around
  the XLA chunk form on packed rows, outputs and final state."""
  q, k, v, beta, g = F32(_pure_inputs(n=7, b=1, h=1, dv=4))
  cores = gated_deltaproduct.CORES
  assert cores.pallas.substeps is delta.DELTA.pallas
  args = (q, l2_jax(k), v, g[..., None], beta)
  kwargs = {'segment_ids': jnp.asarray([[1, 1, 1, 0, 2, 2, 2]]), 'chunk_size': 2}
  got = cores.pallas(*args, **kwargs)
  want = cores.chunked(*args, **kwargs)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def l2_jax(a):
  return a / jnp.sqrt(jnp.sum(a * a, -1, keepdims=True) + 1e-6)

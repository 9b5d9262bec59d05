"""Packed rows in the gated recurrences (retention, GLA, Mamba-2, DeltaNet, Gated DeltaNet):
the mechanism (short convolution, gates, recurrence, output norm) on a packed row equals
each of its documents run alone, outputs and gradients, the packed row in float32 against
the documents in float64; decoding a packed row token by token resets at each document;
the pure functions take `segment_ids`, `initial_state` and `return_final_state`, and
streaming a row in pieces equals one call (docs/design.md, "Documents").
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.layers import multi_head as layer_lib
from efficient_attn.mechanisms import gated_family
from efficient_attn.ops import segments

GATED = registry.names_where(lambda m: isinstance(m, gated_family.GatedRecurrence))
KERNELS = tuple(name for name in GATED if ea.get_mechanism(name).cores.pallas is not None)
B, N, HEADS, HEAD_DIM, FEATURES, CHUNK = 2, 13, 2, 4, 3, 4
# A document of one token, documents across a chunk boundary (of 4), an id reused by a
# later document, leading and trailing padding. (No padding gap inside a document: the
# short convolution's taps are positions, so a gap reads zeros there, as key padding does;
# tests/ops/test_short_conv.py checks that.)
IDS = np.asarray(
  [[3, 1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 0, 0], [0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4, 0]], np.int32
)


def alone(fn, ids):
  """fn on each document of the packed rows `ids` `[b, n]` alone: `[b, n, ...]` arrays of a
  packed layout are gathered into one row per document (its real tokens, left-aligned,
  zeros after: causal, so what follows changes nothing), `fn` runs on them, and its output
  goes back to the packed layout (0 at padding)."""
  with jax.ensure_compile_time_eval():  # `ids` are concrete; `run` may be traced
    docs = np.asarray(segments.document_index(ids))
  rows = [
    np.where((docs[r] == d) & (ids[r] != 0))[0] for r in range(len(ids)) for d in set(docs[r])
  ]
  owner = [r for r in range(len(ids)) for _ in set(docs[r])]
  rows, owner = zip(*[(at, r) for at, r in zip(rows, owner) if at.size])
  n = ids.shape[1]
  valid = np.zeros((len(rows), n), bool)
  src_row, src_pos = np.zeros((len(rows), n), int), np.zeros((len(rows), n), int)
  for j, (at, r) in enumerate(zip(rows, owner)):
    valid[j, : at.size], src_row[j], src_pos[j, : at.size] = True, r, at

  def gather(x):
    x = x[src_row, src_pos]
    return jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 2)), x, 0)

  def run(*xs):
    out = fn(*map(gather, xs))
    out = jnp.where(valid.reshape(valid.shape + (1,) * (out.ndim - 2)), out, 0)
    return jnp.zeros((len(ids),) + out.shape[1:], out.dtype).at[src_row, src_pos].add(out)

  return run


def _setup(name, seed=0):
  decl = ea.get_mechanism(name)
  options = {'chunk_size': CHUNK}  # the options other than the form
  qk_heads, qk_dim, v_dim = decl.head_shapes(decl.resolve(options), heads=HEADS, head_dim=HEAD_DIM)
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((B, N, qk_heads, qk_dim)) for _ in range(2))
  v = rng.standard_normal((B, N, HEADS, v_dim))
  x = rng.standard_normal((B, N, FEATURES))
  specs = layer_lib.declared_params(
    decl,
    decl.resolve(options),
    heads=HEADS,
    head_dim=HEAD_DIM,
    max_length=None,
    causal=True,
    features=FEATURES,
  )
  params = {}
  for i, (key, (shape, init)) in enumerate(sorted(specs.items())):
    value = np.asarray(init(jax.random.PRNGKey(i), shape, jnp.float32), np.float64)
    params[key] = value + 0.1 * rng.standard_normal(shape)
  return decl, options, params, (q, k, v, x)


def _layer(decl, options, form, ids, params, q, k, v, x, state=None):
  ctx = registry.Context()
  mask = None
  if ids is not None:
    if state is None:
      ctx.documents, mask = segments.document_index(ids), ids != 0
    else:
      ctx.documents = ids  # a step takes the token's segment id
  return layer_lib.run_mechanism(
    decl,
    decl.resolve({**options, 'form': form}),
    params,
    q,
    k,
    v,
    mask=mask,
    causal=True,
    ctx=ctx,
    use_rotary=False,
    inputs=x,
    head_dim=HEAD_DIM,
    state=state,
  )


@pytest.mark.parametrize('name', GATED)
def test_a_packed_row_equals_its_documents_alone(name):
  """The layer's mechanism (chunk form, float32) on the packed rows equals the documents
  run alone (token recurrence, float64): outputs and the gradients of q, k, v, the layer
  input and every parameter; padding's outputs are 0."""
  decl, options, params, inputs = _setup(name)
  ids = jnp.asarray(IDS)
  cotangent = np.random.default_rng(1).standard_normal((B, N, HEADS, inputs[2].shape[-1]))
  cotangent = np.where((IDS != 0)[..., None, None], cotangent, 0.0)

  def loss(fn, params, *xs):
    return jnp.sum(fn(params, *xs) * cotangent)

  with jax.enable_x64(True):
    f64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (params, inputs))
    by_document = lambda p, *xs: alone(
      functools.partial(_layer, decl, options, 'naive', None, p), IDS
    )(*xs)
    want, want_grads = jax.jit(  # one compiled program, not op by op
      lambda p, *xs: (
        by_document(p, *xs),
        jax.grad(functools.partial(loss, by_document), argnums=(0, 1, 2, 3, 4))(p, *xs),
      )
    )(f64[0], *f64[1])
    want, want_grads = jax.tree.map(np.asarray, (want, want_grads))
  packed = functools.partial(_layer, decl, options, 'chunk', ids)
  f32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), (params, inputs))
  got, grads = jax.jit(
    lambda p, *xs: (
      packed(p, *xs),
      jax.grad(functools.partial(loss, packed), argnums=(0, 1, 2, 3, 4))(p, *xs),
    )
  )(f32[0], *f32[1])
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=name)
  assert not np.asarray(got)[IDS == 0].any()
  for (path, g), w in zip(
    jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(want_grads)
  ):
    scale = max(1.0, float(np.abs(w).max()))
    np.testing.assert_allclose(
      g, w, atol=1e-5 * scale, rtol=1e-4, err_msg=f'{name} {jax.tree_util.keystr(path)}'
    )


@pytest.mark.parametrize('name', GATED)
def test_decoding_a_packed_row_resets_at_each_document(name):
  """Step by step, each token with its segment id, equals the parallel form on the row."""
  decl, options, params, inputs = _setup(name)
  f32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), (params, inputs))
  params, (q, k, v, x) = f32
  want = jax.jit(functools.partial(_layer, decl, options, 'chunk'))(
    jnp.asarray(IDS), params, q, k, v, x
  )
  state = decl.init_state(
    decl.resolve(options), batch=B, heads=HEADS, head_dim=q.shape[3], v_dim=v.shape[3]
  )
  step = jax.jit(lambda s, ids, *xs: _layer(decl, options, 'chunk', ids, params, *xs, state=s))
  outs = []
  for t in range(N):
    state, out = step(
      state, jnp.asarray(IDS[:, t : t + 1]), *(a[:, t : t + 1] for a in (q, k, v, x))
    )
    outs.append(out)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, atol=1e-5, rtol=1e-5, err_msg=name)


def _pure_inputs(name):
  decl, options, params, (q, k, v, x) = _setup(name)
  f32 = lambda a: jax.tree.map(lambda t: jnp.asarray(t, jnp.float32), a)
  params, q, k, v, x = f32((params, q, k, v, x))
  q, k = decl._to_heads(q, k, HEADS)  # pylint: disable=protected-access
  return decl, params, q, k, v, decl.gates(decl.resolve(options), params, x)


@pytest.mark.parametrize('name', GATED)
def test_a_pure_function_on_a_packed_row_equals_its_documents_alone(name):
  decl, params, q, k, v, gates = _pure_inputs(name)
  keys = sorted(gates)

  def pure(ids, q, k, v, *gate_values, form='chunk'):
    return decl.run_pure_function(
      q, k, v, dict(zip(keys, gate_values)), params, segment_ids=ids, chunk_size=CHUNK, form=form
    )

  got = jax.jit(pure)(jnp.asarray(IDS), q, k, v, *(gates[key] for key in keys))
  want = jax.jit(alone(functools.partial(pure, None, form='naive'), IDS))(
    q, k, v, *(gates[key] for key in keys)
  )
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize('name', GATED)
def test_a_pure_function_streamed_in_pieces_equals_one_call(name):
  """initial_state and return_final_state: a packed row cut inside its documents, each
  piece from the last one's final state, equals one call, outputs and final state."""
  decl, params, q, k, v, gates = _pure_inputs(name)

  @functools.partial(jax.jit, static_argnums=(0, 1))  # one program per piece, not op by op
  def run(lo, hi, state):
    return decl.run_pure_function(
      q[:, lo:hi],
      k[:, lo:hi],
      v[:, lo:hi],
      {key: x[:, lo:hi] for key, x in gates.items()},
      params,
      segment_ids=jnp.asarray(IDS[:, lo:hi]),
      initial_state=state,
      return_final_state=True,
      chunk_size=CHUNK,
    )

  want, want_state = run(0, N, None)
  outs, state = [], None
  for lo, hi in ((0, 3), (3, 8), (8, N)):  # cuts inside documents in both rows
    out, state = run(lo, hi, state)
    outs.append(out)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, atol=1e-5, rtol=1e-5, err_msg=name)
  np.testing.assert_allclose(state, want_state, atol=1e-5, rtol=1e-5, err_msg=name)


def test_the_gated_recurrences_declare_segments():
  assert all(ea.get_mechanism(name).segments for name in GATED)


@pytest.mark.parametrize('name', KERNELS)
def test_the_pallas_kernels_run_packed_rows_as_the_xla_form(name):
  """implementation='pallas' (the kernels, interpreted on a CPU) on the packed rows equals
  'xla', outputs and the gradients of q, k, v, the layer input and every parameter (the
  kernels against the float64 recurrence: tests/ops/test_kernels.py)."""
  decl, options, params, inputs = _setup(name)
  f32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), (params, inputs))
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal((B, N, HEADS, 1)), jnp.float32)

  def loss(implementation, params, *xs):
    chosen = {**options, 'implementation': implementation}
    out = _layer(decl, chosen, 'chunk', jnp.asarray(IDS), params, *xs)
    return jnp.sum(out * cotangent), out

  got = {}
  for implementation in ('xla', 'pallas'):
    fn = jax.value_and_grad(
      functools.partial(loss, implementation), argnums=(0, 1, 2, 3, 4), has_aux=True
    )
    (_, out), grads = jax.jit(fn)(f32[0], *f32[1])
    got[implementation] = (out, grads)
  for (path, kernel), xla in zip(
    jax.tree_util.tree_flatten_with_path(got['pallas'])[0], jax.tree.leaves(got['xla'])
  ):
    scale = max(1.0, float(np.abs(xla).max()))
    np.testing.assert_allclose(
      kernel, xla, atol=1e-5 * scale, rtol=1e-4, err_msg=f'{name} {jax.tree_util.keystr(path)}'
    )


def test_the_delta_rule_has_its_mechanism_names():
  mechanisms = ea.mechanisms
  assert mechanisms.deltanet_attention is mechanisms.delta_rule_attention
  assert mechanisms.gated_deltanet_attention is mechanisms.delta_rule_attention
  assert mechanisms.pure_function('deltanet') is mechanisms.deltanet_attention
  assert mechanisms.pure_function('gated_deltanet') is mechanisms.gated_deltanet_attention

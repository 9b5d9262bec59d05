"""The NNX layer equals the Linen layer for every mechanism x projection, and works as NNX code.

Parity is tested with the same parameters (moved with `load_linen_params`) in
the plain, key-padding, causal, rotary and decoding cases, so every property
the Linen contract tests prove (`test_attention.py`, `test_decode.py`) holds
for the NNX layer too.
"""

import contextlib

from flax import nnx
import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import efficient_attn as ea
from efficient_attn import registry
import efficient_attn.nnx as ean

B, L, D, H = 2, 16, 16, 2
TOL = dict(atol=2e-5, rtol=2e-5)


def _kwargs(mechanism, projection='standard', **kw):
  kw.setdefault('causal', ea.get_mechanism(mechanism).causal_only)  # its only form
  return dict(
    mechanism=mechanism,
    projection=projection,
    max_length=L,
    options=dict(ea.get_mechanism(mechanism).example),
    **kw,
  )


def _pair(mechanism, projection='standard', **kw):
  """(Linen layer, random params, NNX layer holding those params).

  The NNX layer is built abstractly and filled with NumPy draws of its parameters'
  shapes (eager inits compile a kernel per shape, which is slow). The trees match: the
  callers' `_as_state` checks the names, and Linen's apply checks each parameter's shape
  against its initialiser.
  """
  linen = ea.MultiHeadAttention(num_heads=H, **_kwargs(mechanism, projection, **kw))
  layer = nnx.eval_shape(
    lambda: ean.MultiHeadAttention(H, D, rngs=nnx.Rngs(0), **_kwargs(mechanism, projection, **kw))
  )
  shapes = nnx.to_pure_dict(nnx.state(layer, nnx.Param))
  rng = np.random.default_rng(2)
  params = jax.tree.map(lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape), s.dtype), shapes)
  ean.load_linen_params(layer, params)
  return linen, params, layer


def _x(seed=0):
  return jax.random.normal(jax.random.PRNGKey(seed), (B, L, D))


def _same_program(nnx_call, linen_call, *args):
  """The two calls trace to the same jaxpr: the same operations on the same operands, so
  equal outputs for every input (an exact identity, checked without compiling)."""
  ours, theirs = str(jax.make_jaxpr(nnx_call)(*args)), str(jax.make_jaxpr(linen_call)(*args))
  if ours != theirs:
    diff = [f'{a} != {b}' for a, b in zip(ours.splitlines(), theirs.splitlines()) if a != b]
    raise AssertionError(f'the NNX and Linen programs differ: {(diff or ["(length)"])[0]}')


def _as_state(state, tree):
  """`tree` (a Linen variable collection) as the NNX `state` of the same names."""
  assert jax.tree.structure(nnx.to_pure_dict(state)) == jax.tree.structure(tree)
  return jax.tree.unflatten(jax.tree.structure(state), jax.tree.leaves(tree))


@pytest.mark.parametrize('mechanism', ea.list_mechanisms())
def test_nnx_equals_linen_for_every_projection(mechanism):
  """Key padding and causal cases of every projection, rotary, QK norm and grouped-query
  attention: the NNX layer holding the Linen layer's parameters runs the same program.

  (`test_attention.py` runs every mechanism x projection compiled, with key padding and
  causal masks, and checks the outputs.)
  """
  decl = ea.get_mechanism(mechanism)
  valid = jnp.arange(L)[None, :] < jnp.array([[L], [L - 5]])
  cases = {}
  for projection in ea.list_projections():
    cases[projection, 'key padding'] = dict(projection=projection), valid
    if decl.causal:
      cases[projection, 'causal'] = dict(projection=projection, causal=True), None
  if decl.rotary:
    cases['standard', 'rotary'] = dict(rotary=True, causal=decl.causal), None
  cases['efficient', 'qk norm'] = dict(projection='efficient', normalize_qk=True), valid
  if not decl.shared_qk:  # grouped-query attention: one key/value head for both heads
    cases['standard', 'gqa'] = dict(num_kv_heads=1), valid
    if decl.causal:
      cases['standard', 'gqa causal'] = dict(num_kv_heads=1, causal=True), None
  for case, (kw, mask) in cases.items():
    linen, params, layer = _pair(mechanism, **kw)
    graphdef, state, rest = nnx.split(layer, nnx.Param, ...)
    calls = (
      lambda params, x: nnx.merge(graphdef, _as_state(state, params), rest)(x, mask=mask),
      lambda params, x: linen.apply({'params': params}, x, mask=mask),
    )
    if case[1] == 'qk norm':  # each API's own LayerNorm (the same math): compared by value
      ours, theirs = jax.jit(lambda params, x: [call(params, x) for call in calls])(params, _x())
      np.testing.assert_allclose(ours, theirs, err_msg=f'{mechanism} x {case}', **TOL)
      continue
    try:
      _same_program(*calls, params, _x())
    except AssertionError as e:
      raise AssertionError(f'{mechanism} x {case}: {e}') from None


def test_the_program_comparison_can_fail():
  """`_same_program` sees a changed operation and a swapped operand."""
  x = _x()
  _same_program(lambda x: jnp.tanh(x) * 2, lambda x: jnp.tanh(x) * 2, x)
  for other in (lambda x: jnp.tanh(x) * 3, lambda x: jnp.sin(x) * 2):
    with pytest.raises(AssertionError, match='programs differ'):
      _same_program(lambda x: jnp.tanh(x) * 2, other, x)
  with pytest.raises(AssertionError, match='programs differ'):
    _same_program(lambda x, y: x - y, lambda x, y: y - x, x, x)


@pytest.mark.parametrize('mechanism', registry.names_where(lambda m: bool(m.decode)))
@pytest.mark.parametrize('projection', ['standard', 'super', 'gqa'])
def test_nnx_decoding_equals_linen_decoding(mechanism, projection):
  """'gqa': the standard projection with one key/value head for the two query heads.

  The NNX cache starts equal to the Linen cache, under the same names and shapes, and a
  decoding step (output and updated cache) is the same program in both.
  """
  x = _x()
  decl = ea.get_mechanism(mechanism)
  kw = dict(causal=True, rotary=bool(decl.rotary))
  if projection == 'gqa':
    projection, kw['num_kv_heads'] = 'standard', 1
  linen, params, layer = _pair(mechanism, projection, **kw)
  dec = linen.clone(decode=True)
  initial = helpers.empty_cache(dec, {'params': params}, x)['cache']  # as Linen makes it
  layer.init_cache(x.shape)
  graphdef, state, cache_state, rest = nnx.split(layer, nnx.Param, nnx.Cache, ...)
  # Flax's names; a key/value cache or a grouped state keeps only the kv heads.
  jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(cache_state), initial)
  rng = np.random.default_rng(3)  # a step from a cache part-way through, any values
  cache = jax.tree.map(lambda a: jnp.asarray(rng.random(a.shape) * 4, a.dtype), initial)

  def nnx_step(params, cache, x_t):
    model = nnx.merge(graphdef, _as_state(state, params), _as_state(cache_state, cache), rest)
    return model(x_t, decode=True), nnx.to_pure_dict(nnx.state(model, nnx.Cache))

  def linen_step(params, cache, x_t):
    y, variables = dec.apply({'params': params, 'cache': cache}, x_t, mutable=['cache'])
    return y, variables['cache']

  _same_program(nnx_step, linen_step, params, cache, x[:, :1])
  heads = (
    kw.get('num_kv_heads', H)
    if (decl.decode == 'kv_cache' or decl.grouped_state(decl.resolve(decl.example)))
    else H
  )
  state = cache.get('cached_key', cache.get('cached_state'))
  window = decl.kv_window(decl.resolve(decl.example)) if decl.decode == 'kv_cache' else None
  slots = L if window is None else min(L, window)  # local attention: a ring buffer
  assert jax.tree.leaves(state)[0].shape[:2] in ((B, heads), (B, slots))
  assert jax.tree.leaves(state)[0].shape[2 if decl.decode == 'kv_cache' else 1] == heads


@pytest.mark.parametrize('mechanism', ['softmax', 'linear'])  # a key/value cache, a state
def test_nnx_decoding_runs_and_equals_the_parallel_pass(mechanism):
  x = _x()
  linen, params, layer = _pair(mechanism, causal=True)
  layer.init_cache(x.shape)
  step = nnx.jit(lambda layer, x_t: layer(x_t, decode=True))
  ys = [step(layer, x[:, t : t + 1]) for t in range(L)]
  np.testing.assert_allclose(
    jnp.concatenate(ys, axis=1), jax.jit(linen.apply)({'params': params}, x), **TOL
  )
  assert int(layer.cache_index[...]) == L


def _error(make):
  with pytest.raises(ValueError) as e:
    make()
  assert '\n' not in str(e.value)
  return str(e.value)


def test_bad_input_gets_the_same_one_line_error_from_both_wrappers():
  x = _x()
  cases = {
    'unknown mechanism': dict(mechanism='nope'),
    'unknown option': dict(mechanism='nystrom', options={'landmarks': 4}),
    'option out of range': dict(mechanism='nystrom', options={'num_landmarks': 0}),
    'no causal form': dict(mechanism='fnet', causal=True),
    'dropout without weights': dict(mechanism='linear', dropout_rate=0.1),
    'unknown projection': dict(projection='fancy'),
    'super without a length': dict(projection='super'),
  }
  for what, kw in cases.items():
    linen = _error(lambda: ea.MultiHeadAttention(num_heads=H, **kw).init(jax.random.PRNGKey(0), x))
    ours = _error(lambda: ean.MultiHeadAttention(H, D, rngs=nnx.Rngs(0), **kw)(x))
    assert linen == ours, (what, linen, ours)
  causal_mask = nn.make_causal_mask(jnp.ones((B, L)))
  linen, params, layer = _pair('linear')
  assert _error(lambda: layer(x, mask=causal_mask)) == _error(
    lambda: linen.apply({'params': params}, x, mask=causal_mask)
  )
  for args in ((x, None, x), (x, x, causal_mask)):  # values without keys; a positional mask
    with pytest.warns(DeprecationWarning) if args[2].dtype == bool else contextlib.nullcontext():
      assert _error(lambda: layer(*args)) == _error(lambda: linen.apply({'params': params}, *args))
  with pytest.warns(DeprecationWarning, match='inputs_kv'):
    np.testing.assert_array_equal(
      linen.apply({'params': params}, x, inputs_kv=x[::-1]),
      linen.apply({'params': params}, x, x[::-1]),
    )
  assert _error(lambda: layer(x[:, :, :8])).startswith('inputs have 8 features')
  assert 'init_cache' in _error(lambda: _pair('linear', causal=True)[2](x[:, :1], decode=True))
  for kw in (
    dict(num_kv_heads=3),
    dict(num_kv_heads=1, projection='efficient'),
    dict(num_kv_heads=1, mechanism='reformer'),
    dict(mechanism='linear', force_fp32_for_softmax=True),
  ):
    message = _error(
      lambda: ea.MultiHeadAttention(num_heads=H, **kw).init(jax.random.PRNGKey(0), x)
    )
    assert message == _error(lambda: ean.MultiHeadAttention(H, D, rngs=nnx.Rngs(0), **kw)), kw
    assert str(kw.get('num_kv_heads', 'force_fp32_for_softmax')) in message
  assert _error(lambda: layer(x, sow_weights=True)) == _error(
    lambda: linen.apply({'params': params}, x, sow_weights=True)
  )


def test_converter_round_trip_and_a_mismatched_tree_is_named():
  linen, params, layer = _pair('linformer', 'optimised')
  back = ean.to_linen_params(layer)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  bad = jax.tree.map(lambda p: p, params)
  bad['query']['kernel'] = bad['query']['kernel'][:-1]
  assert 'query/kernel' in _error(lambda: ean.load_linen_params(layer, bad))
  del bad['query']
  assert "'query'" in _error(lambda: ean.load_linen_params(layer, bad))


def test_leading_batch_axes_and_dropout_as_in_flax():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 2, L, D))
  layer = ean.MultiHeadAttention(
    H, D, mechanism='softmax', dropout_rate=0.5, rngs=nnx.Rngs(0, dropout=1)
  )
  y = layer(x, deterministic=True)
  np.testing.assert_allclose(y[1, 0], layer(x[1, 0][None], deterministic=True)[0], **TOL)
  assert not np.allclose(layer(x, deterministic=False), y)
  assert 'deterministic' in _error(lambda: layer(x))


def test_jit_grad_scan_over_a_stack_and_optimizer():
  """Three layers made with nnx.vmap, run with nnx.scan, trained with nnx.Optimizer."""

  @nnx.split_rngs(splits=3)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def stack(rngs):
    return ean.MultiHeadAttention(
      H, D, mechanism='performer', projection='efficient', options={'num_features': 8}, rngs=rngs
    )

  layers = stack(nnx.Rngs(0))
  x, target = _x(), _x(1)

  def loss_fn(layers):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def through(h, layer):
      return h + layer(h)

    return jnp.mean((through(x, layers) - target) ** 2)

  optimizer = nnx.Optimizer(layers, optax.adam(1e-2), wrt=nnx.Param)

  @nnx.jit
  def train_step(layers, optimizer):
    loss, grads = nnx.value_and_grad(loss_fn)(layers)
    optimizer.update(layers, grads)
    return loss

  losses = [float(train_step(layers, optimizer)) for _ in range(5)]
  assert losses[-1] < losses[0], losses
  assert layers.query.kernel.shape == (3, D, H, D // H)


@pytest.mark.slow
def test_the_nnx_vit_example_trains():
  from examples import nnx_vit  # pylint: disable=g-import-not-at-top

  (x, y), _ = nnx_vit.digits()
  model = nnx_vit.ViT(mechanism='linear', projection='efficient', depth=1, rngs=nnx.Rngs(0))
  losses = nnx_vit.train(model, x, y, steps=30, batch=32, learning_rate=1e-2)
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3, losses


def test_flax_nnx_layer_with_our_attention_fn_or_qk_norm_equals_ours():
  """`make_attention_fn` inside flax's own nnx.MultiHeadAttention equals our NNX layer, and
  so does flax's QK layer norm."""
  x = _x()
  flax_layer = nnx.MultiHeadAttention(
    H, D, attention_fn=ea.make_attention_fn('linear'), decode=False, rngs=nnx.Rngs(0)
  )
  for causal in (False, True):
    ours = ean.MultiHeadAttention(H, D, mechanism='linear', causal=causal, rngs=nnx.Rngs(1))
    ean.load_linen_params(ours, ean.to_linen_params(flax_layer))
    np.testing.assert_allclose(flax_layer(x, is_causal=causal), ours(x), **TOL)
  flax_qk_norm = nnx.MultiHeadAttention(H, D, normalize_qk=True, decode=False, rngs=nnx.Rngs(0))
  ours = ean.MultiHeadAttention(H, D, normalize_qk=True, rngs=nnx.Rngs(1))
  ean.load_linen_params(ours, ean.to_linen_params(flax_qk_norm))
  np.testing.assert_allclose(flax_qk_norm(x), ours(x), **TOL)
  with pytest.raises(ValueError, match="'fnet' has no causal form"):
    fnet = nnx.MultiHeadAttention(
      H, D, attention_fn=ea.make_attention_fn('fnet'), decode=False, rngs=nnx.Rngs(0)
    )
    fnet(x, is_causal=True)

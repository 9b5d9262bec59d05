"""The contract every registered mechanism and projection scheme keeps, through the public API.

Every test loops over the registry: a new mechanism is covered by adding its
file (with `example` options that make it non-trivial at length 16).
"""

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.ops import traced_checks

B, L, D, H = 2, 16, 32, 4
MECHANISMS = ea.list_mechanisms()
CAUSAL = registry.names_where(lambda m: m.causal)
KEY_PADDING_ONLY = registry.names_where(lambda m: m.masks == 'key_padding')


def _layer(mechanism, projection='standard', causal=False, **kw):
  """The layer; a causal-only mechanism is always built causal (it has no other form)."""
  decl = ea.get_mechanism(mechanism)
  return ea.MultiHeadAttention(
    num_heads=H,
    mechanism=mechanism,
    projection=projection,
    options=decl.example,
    causal=causal or decl.causal_only,
    max_length=L,
    **kw,
  )


def _inputs(seed=0, scale=1.0, dtype=jnp.float32, shape=(B, L, D)):
  return (scale * jax.random.normal(jax.random.PRNGKey(seed), shape)).astype(dtype)


_INITIALISED = {}  # one init per layer configuration and input shape, shared by the tests


def _init(layer, x):
  """The layer's variables (from key 0), computed once per (layer fields, input shape).

  The compute dtypes are not in the key: Flax draws the parameters in `param_dtype`
  whatever the layer's or the input's dtype, so the same values serve both."""
  key = (layer.mechanism, layer.projection, layer.causal, layer.max_length, layer.param_dtype)
  key += (x.shape,)
  if key not in _INITIALISED:
    _INITIALISED[key] = jax.jit(layer.init)(jax.random.PRNGKey(0), x)
  return jax.tree.map(lambda a: a, _INITIALISED[key])  # fresh containers: callers may edit


# The property tests over sequences of several blocks or chunks: 64 tokens, with each
# mechanism's example options and blocks or chunks of at most 8 tokens.
LONG, WIDTH = 64, 8


def _long_options(mechanism):
  """The example options, with a chunk_size of 8 (chunked kernel forms) where unset."""
  decl = ea.get_mechanism(mechanism)
  options = dict(decl.example)
  if 'chunk_size' in {option.name for option in decl.options} and options.get('chunk_size') is None:
    options['chunk_size'] = 8
  return options


def _long_layer(mechanism, projection, causal=False):
  """`_layer` for LONG tokens of WIDTH features (2 heads)."""
  return _layer(mechanism, projection, causal).clone(
    num_heads=2, options=_long_options(mechanism), max_length=LONG
  )


def test_declarations_are_complete():
  assert MECHANISMS[0] == 'softmax' and len(set(MECHANISMS)) == len(MECHANISMS)
  assert ea.list_projections() == ('standard', 'optimised', 'efficient', 'super')
  registry.option_table()  # one type per option name across mechanisms
  for decl in registry.mechanisms():
    assert decl.description and decl.citation and all(decl.complexity), decl.name
    assert decl.masks in registry.MASKS and decl.decode in registry.DECODE_FORMS
    decl.resolve(decl.example)
    for opt in decl.options:
      assert opt.doc and opt.describe(), (decl.name, opt.name)
    if decl.knob is not None:
      assert decl.knob[0] in {option.name for option in decl.options}, decl.name
    if decl.decode == 'recurrent':
      assert type(decl).step is not registry.Mechanism.step, decl.name


def test_unknown_names_and_options_list_valid_ones():
  with pytest.raises(ValueError, match="'nope'.*softmax.*nystrom"):
    ea.get_mechanism('nope')
  x = _inputs()
  with pytest.raises(ValueError, match="'bogus'.*standard.*super"):
    ea.MultiHeadAttention(num_heads=H, projection='bogus').init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="unknown option.*'landmarks'.*num_landmarks"):
    ea.MultiHeadAttention(num_heads=H, mechanism='nystrom', options={'landmarks': 3}).init(
      jax.random.PRNGKey(0), x
    )


@pytest.mark.parametrize('mechanism', MECHANISMS)
def test_bad_option_values_name_the_option_and_what_is_allowed(mechanism):
  """Each option refuses a value of the wrong type, and one out of range, in one line."""
  decl = ea.get_mechanism(mechanism)
  for opt in decl.options:
    bad = [object()] if opt.type is bool else ['abc'] if opt.type in (int, float) else [3]
    if opt.choices:
      bad.append('bogus')
    if opt.minimum is not None:
      bad.append(opt.type(opt.minimum - 1))
    if opt.above is not None:
      bad.append(opt.type(opt.above))
    for value in bad:
      with pytest.raises(ValueError) as e:
        registry.configure(mechanism, {opt.name: value})
      message = str(e.value)
      assert f'{opt.name}=' in message and opt.describe() in message and '\n' not in message


def test_bad_combinations_say_why():
  x = _inputs()
  with pytest.raises(ValueError, match="'nystrom' has no causal form"):
    _layer('nystrom', causal=True).init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match='num_heads=3 must divide'):
    ea.MultiHeadAttention(num_heads=3).init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="dropout_rate=0.1: .*softmax.*not 'linear'"):
    ea.MultiHeadAttention(num_heads=H, mechanism='linear', dropout_rate=0.1).init(
      jax.random.PRNGKey(0), x, deterministic=False
    )
  with pytest.raises(ValueError, match="'super' needs max_length"):
    ea.MultiHeadAttention(num_heads=H, projection='super').init(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match='exceeds max_length=8'):
    ea.MultiHeadAttention(num_heads=H, projection='super', max_length=8).init(
      jax.random.PRNGKey(0), x
    )
  for name in registry.names_where(lambda m: m.fixed_length):
    with pytest.raises(ValueError, match=f"'{name}' has length-shaped parameters"):
      ea.MultiHeadAttention(num_heads=H, mechanism=name).init(jax.random.PRNGKey(0), x)


def test_standard_softmax_equals_flax():
  x = _inputs()
  kv = _inputs(1)
  mask = nn.make_attention_mask(
    jnp.ones((B, L), bool), jnp.arange(L)[None, :] < jnp.array([[L], [L - 5]])
  )
  ours = ea.MultiHeadAttention(num_heads=H)
  ref = nn.MultiHeadDotProductAttention(num_heads=H)
  params = ours.init(jax.random.PRNGKey(0), x, kv)['params']
  ref_params = ref.init(jax.random.PRNGKey(0), x, kv)['params']
  assert jax.tree.structure(params) == jax.tree.structure(ref_params)
  for m in (None, mask):
    a = ours.apply({'params': params}, x, kv, mask=m)
    b = ref.apply({'params': params}, x, kv, mask=m)
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_flax_fields_and_call_arguments_give_flax_results():
  """Two batch axes, attention dropout (from rngs or dropout_rng), the out_* initialisers,
  precision and QK layer norm: the same parameters and the same outputs as flax's layer."""
  x = _inputs(shape=(2, 3, L, 8))
  kw = dict(
    num_heads=2,
    dropout_rate=0.5,
    out_kernel_init=nn.initializers.ones,
    out_bias_init=nn.initializers.ones,
    precision='highest',
    normalize_qk=True,
  )
  ours, ref = ea.MultiHeadAttention(**kw), nn.MultiHeadDotProductAttention(**kw)
  variables = ref.init(jax.random.PRNGKey(1), x, deterministic=True)
  jax.tree.map(
    np.testing.assert_array_equal,
    ours.init(jax.random.PRNGKey(1), x, deterministic=True),
    variables,
  )
  rng = jax.random.PRNGKey(5)
  for call in (dict(dropout_rng=rng), dict(rngs={'dropout': rng})):
    np.testing.assert_allclose(
      ours.apply(variables, x, deterministic=False, **call),
      ref.apply(variables, x, deterministic=False, **call),
      atol=1e-5,
      rtol=1e-5,
    )


@pytest.mark.parametrize('force_fp32', [True, False])
def test_sown_weights_and_force_fp32_as_flax(force_fp32):
  """sow_weights puts flax's 'attention_weights' (two batch axes here) in 'intermediates',
  float32 with force_fp32_for_softmax, else the layer dtype; outputs as flax's in bfloat16.
  Linear attention never forms the weights and refuses both by name."""
  x = _inputs(shape=(2, 3, L, 8))
  kw = dict(num_heads=2, dtype=jnp.bfloat16, force_fp32_for_softmax=force_fp32)
  ours, ref = ea.MultiHeadAttention(**kw), nn.MultiHeadDotProductAttention(**kw)
  variables = ref.init(jax.random.PRNGKey(2), x)
  (y, sown), (y_ref, sown_ref) = (
    m.apply(variables, x, sow_weights=True, mutable=['intermediates']) for m in (ours, ref)
  )
  (w,), (w_ref,) = (t['intermediates']['attention_weights'] for t in (sown, sown_ref))
  assert w.shape == w_ref.shape == (2, 3, 2, L, L)
  assert w.dtype == w_ref.dtype == (jnp.float32 if force_fp32 else jnp.bfloat16)
  np.testing.assert_allclose(np.float32(w), np.float32(w_ref), atol=1e-2)
  np.testing.assert_allclose(np.float32(y), np.float32(y_ref), atol=3e-2, rtol=3e-2)
  assert 'intermediates' not in ours.apply(variables, x, mutable=['intermediates'])[1]
  for bad in (dict(call=dict(sow_weights=True)), dict(force_fp32_for_softmax=True)):
    arg = 'sow_weights' if 'call' in bad else 'force_fp32_for_softmax'
    layer = ea.MultiHeadAttention(
      num_heads=2, mechanism='linear', **{k: v for k, v in bad.items() if k != 'call'}
    )
    with pytest.raises(ValueError, match=f"{arg}=True: mechanism 'linear' never forms"):
      layer.init(jax.random.PRNGKey(0), x, **bad.get('call', {}))


@pytest.mark.parametrize('d,h,l', [(128, 4, 64), (32, 4, 16), (64, 8, 10)])
def test_parameter_counts_match_the_paper(d, h, l):
  """Hosseini & Hosseini (2024): 4, 3, 2 (d^2 + d), and 2 (d^2 + d) + l^2 + l for super."""
  x = jnp.zeros((1, l, d))
  expected = {
    'standard': 4 * (d * d + d),
    'optimised': 3 * (d * d + d),
    'efficient': 2 * (d * d + d),
    'super': 2 * (d * d + d) + l * l + l,
  }
  for projection, count in expected.items():
    layer = ea.MultiHeadAttention(num_heads=h, projection=projection, max_length=l)
    params = jax.eval_shape(layer.init, jax.random.PRNGKey(0), x)['params']
    assert sum(p.size for p in jax.tree.leaves(params)) == count, projection


@pytest.mark.parametrize('mechanism', CAUSAL)
def test_no_look_ahead(mechanism):
  """Causal layers, every projection scheme, 64 tokens (several blocks or chunks): changing
  every token after t, to other values or to NaN and Inf, moves no output at or before t,
  for cuts at block edges and inside blocks, and does move later outputs (the test can
  fail); after a NaN or Inf, the next output is not finite. Batch row i holds the tokens
  changed after CUTS[i]; one compiled call per projection runs them all."""
  cuts = (3, 12, 29, 47, 60)
  x = _inputs(shape=(1, LONG, WIDTH))
  later = jnp.arange(LONG)[None, :, None] > jnp.array(cuts)[:, None, None]
  changed = jnp.where(later, 10.0 * _inputs(9, shape=(len(cuts), LONG, WIDTH)), x)
  not_finite = jnp.where(later, jnp.array([jnp.nan, jnp.inf, -jnp.inf] * 3)[:WIDTH], x)
  same = jnp.broadcast_to(x, changed.shape)
  for projection in ea.list_projections():
    layer = _long_layer(mechanism, projection, causal=True)
    variables = helpers.random_variables(layer, same)
    apply = jax.jit(layer.apply)
    y, y_changed, y_not_finite = (apply(variables, z) for z in (same, changed, not_finite))
    helpers.assert_close_where(y_changed, y, ~later[..., 0], f'{projection}: outputs up to t')
    helpers.assert_close_where(
      y_not_finite, y, ~later[..., 0], f'{projection}: outputs up to t, NaN and Inf after it'
    )
    for i, t in enumerate(cuts):
      assert not np.allclose(y_changed[i, t + 1 :], y[i, t + 1 :]), (projection, t)
      assert not np.isfinite(y_not_finite[i, t + 1]).all(), (projection, t)


@pytest.mark.parametrize('mechanism', MECHANISMS)
def test_declared_parameters_are_created_and_parameter_free_means_none(mechanism):
  decl = ea.get_mechanism(mechanism)
  layer = _layer(mechanism)
  params = jax.eval_shape(layer.init, jax.random.PRNGKey(0), _inputs())['params']
  options = decl.resolve(decl.example)
  specs = dict(decl.params(options, heads=H, head_dim=D // H, max_length=L, causal=False))
  if decl.reads_input:  # gate projections of the layer input
    specs.update(decl.input_params(options, features=D, heads=H, head_dim=D // H))
  want = {n: tuple(s) for n, (s, _) in specs.items()}
  got = jax.tree.map(lambda p: tuple(p.shape), dict(params.get('mechanism', {})))
  assert got == want
  if decl.parameter_free:
    assert not want and not decl.random_features


@pytest.mark.parametrize(
  'mechanism', [m.name for m in registry.mechanisms() if m.exact_options(32) is not None]
)
def test_exact_settings_equal_the_reference(mechanism, x64):
  """Where a mechanism declares exact settings (e.g. Nystrom with every token a
  landmark), it equals the attention it approximates, in float64."""
  decl = ea.get_mechanism(mechanism)
  q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 32, 2, 8), jnp.float64) for i in range(3))
  options = decl.exact_options(32)
  mod = ea.mechanism_module(mechanism, max_length=32, options=options)
  out = jax.jit(lambda q, k, v: mod.apply(mod.init(jax.random.PRNGKey(0), q, k, v), q, k, v))(
    q, k, v
  )  # one program: run eagerly, every operation compiles alone
  np.testing.assert_allclose(
    out, decl.reference(decl.resolve(options), q, k, v), rtol=1e-6, atol=1e-6
  )


@pytest.mark.parametrize('mechanism', MECHANISMS)
def test_padded_tokens_move_no_other_output(mechanism):
  """Self-attention over a padded batch, every projection scheme, 64 tokens (several blocks
  or chunks): changing the padded tokens of the layer's input (whole tokens: their queries,
  keys and values, as in a user's padded batch) to other values, or to NaN and Inf, moves
  no real output, while changing one real token does (the test can fail). Row 0 is padded
  on the left, row 1 on the right. The mask is flax's key padding in per-head form,
  `[batch, heads, 1, kv_length]`, the same for every head, which every mechanism accepts."""
  x = _inputs(shape=(2, LONG, WIDTH))
  valid = jnp.stack([jnp.arange(LONG) >= 13, jnp.arange(LONG) < LONG - 21])
  mask = jnp.broadcast_to(valid[:, None, None, :], (2, 2, 1, LONG))
  padded = jnp.where(valid[..., None], x, 10.0 * _inputs(9, shape=x.shape))
  not_finite = jnp.where(valid[..., None], x, jnp.array([jnp.nan, jnp.inf, -jnp.inf] * 3)[:WIDTH])
  moved = x.at[1, 5].add(1.0)
  for projection in ea.list_projections():
    layer = _long_layer(mechanism, projection)
    variables = helpers.random_variables(layer, x)
    apply = jax.jit(lambda v, z, m, layer=layer: layer.apply(v, z, mask=m))
    y, y_padded, y_not_finite, y_moved = (
      apply(variables, z, mask) for z in (x, padded, not_finite, moved)
    )
    assert y.shape == x.shape, projection
    helpers.assert_close_where(y_padded, y, valid, f'{projection}: real outputs')
    helpers.assert_close_where(
      y_not_finite, y, valid, f'{projection}: real outputs, NaN and Inf padding'
    )
    assert not np.allclose(y_moved[1, : LONG - 21], y[1, : LONG - 21]), projection


@pytest.mark.parametrize('mechanism', MECHANISMS)
def test_a_flax_causal_mask_is_honoured_or_refused(mechanism):
  """Mechanisms that form the weights honour nn.make_causal_mask and a per-head mask
  `[batch, heads, 1, kv_length]` (head 0 alone masks keys 10-15) as flax does; the others
  refuse both, concrete at once and traced when they run, in a line that says why."""
  x = _inputs()
  causal_mask = jnp.broadcast_to(nn.make_causal_mask(jnp.ones((B, L))), (B, H, L, L))
  per_head = jnp.ones((B, H, 1, L), bool).at[:, 0, :, 10:].set(False)
  layer = _layer(mechanism)
  variables = helpers.random_variables(layer, x)
  if mechanism in KEY_PADDING_ONLY:
    for mask in (causal_mask, per_head):
      with pytest.raises(
        ValueError, match=f"'{mechanism}' honours only key-padding.*across heads.*causal=True"
      ):
        layer.apply(variables, x, mask=mask)
    refused = jax.jit(lambda m: layer.apply(variables, x, mask=m))  # one compile, both masks
    for mask in (causal_mask, jnp.broadcast_to(per_head, (B, H, L, L))):
      with pytest.raises(Exception) as e:  # JAX's JaxRuntimeError around the ValueError
        refused(mask).block_until_ready()
      last = str(e.value).strip().splitlines()[-1]
      assert last.startswith(f"ValueError: mechanism '{mechanism}' honours only key-padding")
      assert last.endswith(traced_checks.TRACED), last
  else:
    causal = _layer(mechanism, causal=True)
    np.testing.assert_allclose(
      layer.apply(variables, x, mask=causal_mask), causal.apply(variables, x), atol=1e-5, rtol=1e-5
    )
    flax_layer = nn.MultiHeadDotProductAttention(num_heads=H)
    np.testing.assert_allclose(
      layer.apply(variables, x, mask=per_head),
      flax_layer.apply(variables, x, mask=per_head),
      atol=1e-5,
      rtol=1e-5,
    )


@pytest.mark.parametrize('mechanism', MECHANISMS)
def test_inconsistent_shapes_raise_one_line_errors(mechanism):
  decl = ea.get_mechanism(mechanism)
  layer = ea.mechanism_module(
    mechanism, max_length=L, options=decl.example, causal=decl.causal_only
  )
  q = _inputs(shape=(B, L, H, 8))
  inputs = {'inputs': q.reshape(B, L, -1)} if decl.reads_input else {}
  # The errors are about shapes: zero variables of the right shapes (no init to run).
  variables = jax.tree.map(
    lambda s: jnp.zeros(s.shape, s.dtype),
    jax.eval_shape(layer.init, jax.random.PRNGKey(0), q, q, q, **inputs),
  )
  bad = {
    'a mask of the wrong length': (q, q, q, jnp.ones((B, L - 3), bool)),
    'a mask of the wrong rank': (q, q, q, jnp.ones((B, 1, L), bool)),
    'k and v of different lengths': (q, q, q[:, : L - 2], None),
    'rank-3 inputs': (q[:, :, 0], q[:, :, 0], q[:, :, 0], None),
  }
  for what, (qq, kk, vv, mask) in bad.items():
    with pytest.raises(ValueError) as e:
      layer.apply(variables, qq, kk, vv, mask=mask, **inputs)
    assert '\n' not in str(e.value) and (
      'mask' in str(e.value) or 'q ' in str(e.value) or 'rank' in str(e.value)
    ), (what, str(e.value))


@pytest.mark.parametrize('mechanism', MECHANISMS)
def test_bfloat16_large_inputs_and_gradients_are_finite(mechanism):
  for dtype, scales in ((jnp.bfloat16, (1.0, 30.0)), (jnp.float32, (100.0,))):
    layer = _layer(mechanism, dtype=dtype, param_dtype=jnp.float32)
    variables = _init(layer, _inputs(dtype=dtype))
    # Output and gradients from one function, compiled once per dtype, run at every scale.
    value_and_grad = helpers.value_and_grads(layer.apply, num_args=1)
    for scale in scales:
      x = _inputs(scale=scale, dtype=dtype)
      y, (g,) = value_and_grad(variables, x)
      assert y.dtype == dtype
      assert bool(jnp.all(jnp.isfinite(y.astype(jnp.float32)))), (mechanism, dtype, scale)
      assert all(bool(jnp.all(jnp.isfinite(t))) for t in jax.tree.leaves(g)), (
        mechanism,
        dtype,
        scale,
      )


@pytest.mark.parametrize('mechanism', MECHANISMS)
def test_bfloat16_parameters(mechanism):
  x = _inputs(dtype=jnp.bfloat16)
  layer = _layer(mechanism, 'super', dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  variables = _init(layer, x)
  assert {p.dtype for p in jax.tree.leaves(variables['params'])} == {jnp.dtype(jnp.bfloat16)}
  y = jax.jit(layer.apply)(variables, x)
  assert y.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))


def test_leading_batch_axes_as_in_flax():
  """Inputs [batch, h, w, features] attend over the axis before features, like flax."""
  x = _inputs(shape=(2, 3, L, D))
  ours = ea.MultiHeadAttention(num_heads=H)
  ref = nn.MultiHeadDotProductAttention(num_heads=H)
  params = ours.init(jax.random.PRNGKey(0), x)['params']
  valid = jnp.arange(L) < L - 4
  mask = nn.make_attention_mask(jnp.ones((2, 3, L), bool), jnp.broadcast_to(valid, (2, 3, L)))
  np.testing.assert_allclose(
    ours.apply({'params': params}, x, mask=mask),
    ref.apply({'params': params}, x, mask=mask),
    atol=1e-5,
  )
  linear = ea.MultiHeadAttention(num_heads=H, mechanism='linear')
  y = linear.apply({'params': params}, x)
  assert y.shape == x.shape
  np.testing.assert_allclose(y[1, 2], linear.apply({'params': params}, x[1, 2][None])[0], atol=1e-5)


def test_attention_fn_drop_in():
  x = _inputs()
  base = nn.MultiHeadDotProductAttention(num_heads=H)
  params = base.init(jax.random.PRNGKey(0), x)['params']
  for name in ('softmax', 'softmax_chunked', 'local'):
    fn = ea.make_attention_fn(name, **({'window': 4 * L} if name == 'local' else {}))
    swapped = nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=fn)
    np.testing.assert_allclose(
      swapped.apply({'params': params}, x), base.apply({'params': params}, x), atol=1e-5, rtol=1e-5
    )
  linear = nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=ea.make_attention_fn('linear'))
  ours = ea.MultiHeadAttention(num_heads=H, mechanism='linear')
  np.testing.assert_allclose(
    linear.apply({'params': params}, x), ours.apply({'params': params}, x), atol=1e-5, rtol=1e-5
  )
  with pytest.raises(ValueError, match='cannot be an attention_fn'):
    ea.make_attention_fn('performer')
  dropout = nn.MultiHeadDotProductAttention(
    num_heads=H, dropout_rate=0.1, attention_fn=ea.make_attention_fn('softmax')
  )
  with pytest.raises(ValueError, match=r"attention dropout \(dropout_rate=0.1\) in training"):
    dropout.apply(
      {'params': params}, x, deterministic=False, rngs={'dropout': jax.random.PRNGKey(0)}
    )
  np.testing.assert_allclose(
    dropout.apply({'params': params}, x, deterministic=True),
    base.apply({'params': params}, x),
    atol=1e-5,
    rtol=1e-5,
  )
  swapped = nn.MultiHeadDotProductAttention(
    num_heads=H, attention_fn=ea.make_attention_fn('softmax')
  )
  _, sown = swapped.apply({'params': params}, x, sow_weights=True, mutable=['intermediates'])
  _, sown_ref = base.apply({'params': params}, x, sow_weights=True, mutable=['intermediates'])
  np.testing.assert_allclose(
    sown['intermediates']['attention_weights'][0],
    sown_ref['intermediates']['attention_weights'][0],
    atol=1e-5,
  )
  with pytest.raises(ValueError, match="sow_weights=True: mechanism 'linear' never forms"):
    linear.apply({'params': params}, x, sow_weights=True, mutable=['intermediates'])
  local = nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=ea.make_attention_fn('local'))
  with pytest.raises(ValueError, match="mechanism 'local'.*q_length == kv_length"):
    local.apply({'params': params}, x, x[:, : L // 2])  # a self-attention mechanism
  with pytest.raises(ValueError, match="'linear' honours only key-padding"):
    nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=ea.make_attention_fn('linear')).apply(
      {'params': params}, x, mask=nn.make_causal_mask(jnp.ones((B, L)))
    )


def test_super_starts_as_efficient_and_sows_qkv():
  x = _inputs()
  sup = ea.MultiHeadAttention(num_heads=H, projection='super', max_length=L)
  eff = ea.MultiHeadAttention(num_heads=H, projection='efficient')
  variables = sup.init(jax.random.PRNGKey(0), x)
  params = dict(variables['params'])
  params.pop('alignment')
  np.testing.assert_allclose(sup.apply(variables, x), eff.apply({'params': params}, x), atol=1e-6)
  _, state = eff.apply({'params': params}, x, mutable=['attention_qkv'])
  q, k, v = state['attention_qkv']['qkv'][0]
  assert q.shape == k.shape == v.shape == (B, L, H, D // H)
  np.testing.assert_allclose(v, x.reshape(B, L, H, D // H))  # efficient: V sliced, no W_V


@pytest.mark.parametrize('mechanism', registry.names_where(lambda m: not m.shared_qk))
def test_grouped_query_attention_is_attention_with_repeated_key_value_heads(mechanism):
  """num_kv_heads=2 of 4 heads: query head i reads key/value head i // 2, i.e. the layer
  equals multi-head attention whose key and value kernels repeat each kv head twice."""
  x = _inputs()
  gqa = _layer(mechanism, num_kv_heads=2)
  shapes = jax.eval_shape(gqa.init, jax.random.PRNGKey(0), x)['params']
  rng = np.random.default_rng(1)  # NumPy draws: no init to compile
  params = jax.tree.map(lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape), s.dtype), shapes)
  assert params['key']['kernel'].shape == (D, 2, D // H)
  full = jax.tree.map(lambda p: p, params)
  for name in ('key', 'value'):
    full[name] = jax.tree.map(lambda p: jnp.repeat(p, 2, axis=-2), params[name])
  valid = jnp.arange(L)[None, :] < jnp.array([[L], [L - 5]])
  ours, expected = jax.jit(
    lambda x: (
      gqa.apply({'params': params}, x, mask=valid),
      _layer(mechanism).apply({'params': full}, x, mask=valid),
    )
  )(x)
  scale = max(1.0, float(jnp.abs(expected).max()))  # fnet's outputs reach ~100
  np.testing.assert_allclose(ours, expected, atol=2e-6 * scale, rtol=1e-5)

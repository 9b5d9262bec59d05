"""Per-mechanism head shapes (`registry.Mechanism.head_shapes`) through both layers.

The papers' layouts the hook exists for: Mamba-2's shared B and C (Dao & Gu
2024; `ngroups=1`, `d_state` != head_dim), RetNet's values twice as wide as its
queries and keys (Sun et al. 2023; `value_factor=2`) and Based's narrow queries and
keys under the Taylor feature map (Arora et al. 2024; linear's `qk_dim`). Their parameter shapes in
Linen and NNX, Linen == NNX, decoding == the parallel pass, causality and key
padding, every refusal in one line, and the config path. Their three forms against
the float64 recurrences are in test_mamba2.py and test_retention.py.
"""

from flax import nnx
import helpers
import jax
import jax.numpy as jnp
import main_runner
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.layers import head_shapes
import efficient_attn.nnx as ean
from train import modeling
from train import steps
from train import validate

B, L, D, H = 2, 9, 16, 4  # head_dim 4; 9 tokens: two chunks of 4 and one of 1
MAMBA2 = ('mamba2', {'chunk_size': 4, 'ngroups': 1, 'd_state': 6})
RETNET = ('retention', {'chunk_size': 4, 'value_factor': 2})
BASED = ('linear', {'chunk_size': 4, 'feature_map': 'taylor', 'qk_dim': 3})
LAYOUTS = {
  'mamba2 ngroups=1': MAMBA2,
  'mamba2 ngroups=2': ('mamba2', {'chunk_size': 4, 'ngroups': 2, 'd_state': 6}),
  'retnet value_factor=2': RETNET,
  'based qk_dim=3': BASED,
}


def _linen(layout, **kw):
  mechanism, options = LAYOUTS[layout] if isinstance(layout, str) else layout
  return ea.MultiHeadAttention(num_heads=H, mechanism=mechanism, options=options, causal=True, **kw)


def _nnx(layout, **kw):
  mechanism, options = LAYOUTS[layout] if isinstance(layout, str) else layout
  return ean.MultiHeadAttention(
    H, D, mechanism=mechanism, options=options, causal=True, rngs=nnx.Rngs(0), **kw
  )


def _x(seed=0, shape=(B, L, D)):
  return jax.random.normal(jax.random.PRNGKey(seed), shape)


def _random_params(linen):
  """Params of the Linen layer drawn with NumPy (no init to compile)."""
  shapes = jax.eval_shape(linen.init, jax.random.PRNGKey(0), _x())['params']
  rng = np.random.default_rng(1)
  return jax.tree.map(lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape), s.dtype), shapes)


def _shapes(tree):
  return {
    '/'.join(str(getattr(k, 'key', k)) for k in path): tuple(leaf.shape)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def test_the_papers_parameter_shapes_in_linen_and_nnx():
  """Mamba-2 with ngroups=1: query (C) and key (B) kernels [features, 1, d_state] and
  their convolution [4, 1, d_state] with its bias [1, d_state]; RetNet with value_factor=2: value
  and gate
  [features, heads, 2 head_dim], out [heads, 2 head_dim, features]. NNX has the same tree."""
  want = {
    'mamba2 ngroups=1': {
      'query/kernel': (D, 1, 6),
      'query/bias': (1, 6),
      'key/kernel': (D, 1, 6),
      'value/kernel': (D, H, 4),
      'out/kernel': (H, 4, D),
      'mechanism/q_conv': (4, 1, 6),
      'mechanism/k_conv': (4, 1, 6),
      'mechanism/v_conv': (4, H, 4),
      'mechanism/q_conv_bias': (1, 6),
      'mechanism/k_conv_bias': (1, 6),
      'mechanism/v_conv_bias': (H, 4),
      'mechanism/norm_scale': (H, 4),
      'mechanism/gate_kernel': (D, H, 4),
    },
    'retnet value_factor=2': {
      'query/kernel': (D, H, 4),
      'key/kernel': (D, H, 4),
      'value/kernel': (D, H, 8),
      'value/bias': (H, 8),
      'out/kernel': (H, 8, D),
      'mechanism/gate_kernel': (D, H, 8),
    },
    'based qk_dim=3': {
      'query/kernel': (D, H, 3),
      'key/kernel': (D, H, 3),
      'value/kernel': (D, H, 4),
      'out/kernel': (H, 4, D),
    },
  }
  for layout, expected in want.items():
    linen = _shapes(jax.eval_shape(_linen(layout).init, jax.random.PRNGKey(0), _x())['params'])
    ours = _shapes(ean.to_linen_params(nnx.eval_shape(lambda layout=layout: _nnx(layout))))
    assert ours == linen, layout
    assert {name: linen[name] for name in expected} == expected, layout
  # The paper's layout saves the per-head B and C: 2 (D + 1 + 4 + 1) (H * 4 - 6) parameters
  # (projection kernel and bias, convolution kernel and bias).
  count = lambda options: sum(
    np.prod(s)
    for s in _shapes(
      jax.eval_shape(_linen(('mamba2', options)).init, jax.random.PRNGKey(0), _x())['params']
    ).values()
  )
  assert count({}) - count(MAMBA2[1]) == 2 * (D + 1 + 4 + 1) * (H * 4 - 6)


def test_nnx_equals_linen_and_decoding_equals_the_parallel_pass():
  """Shared groups (with QK layer norm on their shapes) and wide values: the NNX layer with
  the Linen params gives the Linen outputs (plain and key padding), and token by token
  decoding in both layers gives the parallel pass; RetNet's wide values and Based's narrow
  queries and keys with grouped-query attention (2 key/value heads for 4)."""
  valid = jnp.arange(L)[None, :] < jnp.array([[L], [L - 3]])
  x = _x()
  for layout, normalize_qk, kv_heads in (
    ('mamba2 ngroups=2', True, None),
    ('retnet value_factor=2', False, 2),
    ('based qk_dim=3', False, 2),
  ):
    linen = _linen(layout, normalize_qk=normalize_qk, num_kv_heads=kv_heads)
    params = _random_params(linen)
    ours = _nnx(layout, normalize_qk=normalize_qk, num_kv_heads=kv_heads)
    ean.load_linen_params(ours, params)
    what = f'{layout}, normalize_qk={normalize_qk}, num_kv_heads={kv_heads}'
    both = nnx.jit(
      lambda layer, x, mask, linen=linen, params=params: (
        layer(x, mask=mask),
        linen.apply({'params': params}, x, mask=mask),
      )
    )
    for mask in (None, valid):
      np.testing.assert_allclose(*both(ours, x, mask), atol=2e-5, rtol=2e-5, err_msg=what)
    parallel = both(ours, x, None)[1]
    dec = linen.clone(decode=True)
    cache = helpers.empty_cache(dec, {'params': params}, x)
    ours.init_cache(x.shape)

    @nnx.jit
    def step(layer, cache, x_t, dec=dec, params=params):
      y, cache = dec.apply({'params': params, **cache}, x_t, mutable=['cache'])
      return layer(x_t, decode=True), y, cache

    for t in range(L):
      y_ours, y, cache = step(ours, cache, x[:, t : t + 1])
      np.testing.assert_allclose(
        y, parallel[:, t : t + 1], atol=2e-5, rtol=2e-5, err_msg=f'{what}: step {t}'
      )
      np.testing.assert_allclose(y_ours, y, atol=2e-5, rtol=2e-5, err_msg=f'{what}: nnx step {t}')


@pytest.mark.parametrize('layout', LAYOUTS)
def test_no_look_ahead_and_padding_moves_no_real_output(layout):
  """Under every projection scheme the layout allows: changing the tokens after t moves no
  output at or before t (and does move later ones); changing padded tokens moves no real
  output (and changing a real one does)."""
  cut, n_valid = 4, L - 3
  x = _x(shape=(1, L, D))
  later = jnp.arange(L) > cut
  changed = jnp.where(later[None, :, None], 10.0 * _x(9, shape=(1, L, D)), x)
  valid = jnp.arange(L)[None, :] < n_valid
  padded = jnp.where(valid[..., None], x, 10.0 * _x(8, shape=(1, L, D)))
  schemes = ('standard',) if LAYOUTS[layout][1].get('value_factor') else ('standard', 'optimised')
  for projection in schemes:
    linen = _linen(layout, projection=projection)
    params = _random_params(linen)
    apply = jax.jit(
      lambda z, m, linen=linen, params=params: linen.apply({'params': params}, z, mask=m)
    )
    y, y_changed = apply(x, None), apply(changed, None)
    np.testing.assert_allclose(y_changed[:, : cut + 1], y[:, : cut + 1], atol=1e-5)
    assert not np.allclose(y_changed[:, cut + 1 :], y[:, cut + 1 :]), projection
    y, y_padded, y_moved = (apply(z, valid) for z in (x, padded, x.at[0, 1].add(1.0)))
    np.testing.assert_allclose(y_padded[:, :n_valid], y[:, :n_valid], atol=1e-5)
    assert not np.allclose(y_moved[:, :n_valid], y[:, :n_valid]), projection


def _error(make):
  with pytest.raises(ValueError) as e:
    make()
  assert '\n' not in str(e.value)
  return str(e.value)


@pytest.mark.parametrize(
  'mechanism,options,kw,says',
  [
    (
      'mamba2',
      {'ngroups': 1},
      dict(projection='efficient'),
      ["ngroups=1", "'efficient'", "valid: 'standard', 'optimised'"],
    ),
    (
      'mamba2',
      {'d_state': 8},
      dict(projection='super', max_length=L),
      ["d_state=8", "'super'", "valid: 'standard', 'optimised'"],
    ),
    (
      'retention',
      {'value_factor': 2},
      dict(projection='optimised'),
      ["value_factor=2", "'optimised'", "valid: 'standard'"],
    ),
    ('mamba2', {'ngroups': 3}, {}, ["ngroups=3", "num_heads=4", "valid: 1, 2, 4"]),
    (
      'mamba2',
      {'ngroups': 2},
      dict(num_kv_heads=2),
      ["ngroups=2", "num_kv_heads=2", "valid: num_kv_heads=None"],
    ),
  ],
)
def test_what_a_layer_cannot_build_is_refused_in_one_line_by_both(mechanism, options, kw, says):
  layout = (mechanism, options)
  linen = _error(lambda: jax.eval_shape(_linen(layout, **kw).init, jax.random.PRNGKey(0), _x()))
  ours = _error(lambda: _nnx(layout, **kw))
  assert linen == ours
  for part in says:
    assert part in linen, (part, linen)


def test_the_defaults_build_under_every_scheme_and_ngroups_heads_is_the_default():
  """ngroups=None and d_state=None (today's layout) work under 'efficient'; ngroups=heads
  with d_state=head_dim has the same head shapes (its norm is per head, as mamba_ssm's),
  so it does too."""
  for options in ({}, {'ngroups': H, 'd_state': D // H}):
    params = jax.eval_shape(
      _linen(('mamba2', options), projection='efficient').init, jax.random.PRNGKey(0), _x()
    )['params']
    assert params['query']['kernel'].shape == (D, H, D // H)


def test_shapes_other_than_declared_are_refused_by_the_mechanism():
  """q and k must be the declared groups: per-head q and k where ngroups=1 is declared."""
  mechanism, options = MAMBA2
  mod = ea.Mechanism(mechanism=mechanism, options=options, causal=True, head_dim=4)
  q = jnp.zeros((B, L, H, 6))
  v = jnp.zeros((B, L, H, 4))
  message = _error(lambda: jax.eval_shape(mod.init, jax.random.PRNGKey(0), q, q, v, inputs=_x()))
  assert 'ngroups=1, d_state=6' in message and '[batch, length, 1, 6]' in message
  assert f'got q {(B, L, H, 6)}' in message


def test_an_attention_fn_refuses_other_head_shapes(monkeypatch):
  """flax's own layers project to (heads, head_dim): an attention_fn of a parameter-free
  mechanism declaring other shapes refuses them (none is registered; one is added here)."""
  linear = type(ea.get_mechanism('linear'))

  class Wide(linear):
    name = 'wide_values'

    def head_shapes(self, options, *, heads, head_dim):
      return heads, head_dim, 2 * head_dim

  monkeypatch.setitem(registry._MECHANISMS, 'wide_values', Wide())  # pylint: disable=protected-access
  fn = ea.make_attention_fn('wide_values')
  q = jnp.zeros((1, 4, 2, 3))
  message = _error(lambda: fn(q, q, q))
  assert '(2, 3, 6)' in message and 'efficient_attn.MultiHeadAttention' in message


def test_the_mqar_config_takes_mamba2s_ngroups():
  """configs/mqar.py:mamba2 with attention.options.ngroups=1 and d_state=16 validates and
  builds a model whose attention projects one B and C; ngroups=3 with 2 heads is refused
  by the config check."""
  config = main_runner.parsed_config(
    'configs/mqar.py:mamba2',
    '--config.model.depth=1',
    '--config.attention.options.ngroups=1',
    '--config.attention.options.d_state=16',
  )
  validate.validate_config(config)
  model = modeling.create_model(config)
  params = jax.jit(lambda key: steps.init_params(model, config, key))(jax.random.key(0))
  shapes = _shapes(params)
  d = config.model.d_model
  query = [s for name, s in shapes.items() if name.endswith('attention/query/kernel')]
  value = [s for name, s in shapes.items() if name.endswith('attention/value/kernel')]
  assert query == [(d, 1, 16)] and value == [(d, 2, d // 2)]
  assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(params))
  config.attention.options.ngroups = 3
  with pytest.raises(validate.ConfigError, match='ngroups=3'):
    validate.validate_config(config)


def test_head_layout_features_of_each_projection():
  decl = ea.get_mechanism('mamba2')
  shapes = head_shapes.head_layout(
    decl,
    decl.resolve({'ngroups': 2, 'd_state': 6}),
    projection='standard',
    heads=4,
    head_dim=8,
    kv_heads=4,
  )
  assert [shapes.features(n) for n in ('query', 'key', 'value')] == [(2, 6), (2, 6), (4, 8)]
  decl = ea.get_mechanism('retention')
  shapes = head_shapes.head_layout(
    decl, decl.resolve({'value_factor': 2}), projection='standard', heads=4, head_dim=8, kv_heads=2
  )
  assert [shapes.features(n) for n in ('query', 'key', 'value')] == [(4, 8), (2, 8), (2, 16)]

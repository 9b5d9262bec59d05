"""Stacks whose blocks take mechanisms in turn ('linear+local'; `efficient_attn.layers.hybrid`).

Exact identities: a pattern of one mechanism twice is the plain stack; with a window
as long as the sequence, local attention is causal softmax, so 'linear+local' equals
'linear+softmax' on the same weights (each block got its own options); decoding a
pattern token by token equals its parallel form (a recurrent state beside a window's
cache; this also shows the parallel form never looks ahead). The config refuses, in
one line naming the value, what a pattern cannot be; a tiny MQAR run trains one.
"""

import functools
import json
import os

import jax
import main_runner
import numpy as np
import pytest

from efficient_attn import registry
from efficient_attn.layers import hybrid
from efficient_attn.models import CausalTransformer
from efficient_attn.models import Encoder
from efficient_attn.models import TransformerConfig
from studies.recall import decode_state
from studies.recall import run_records
from train import trainer
from train import validate

BASED = {'feature_map': 'taylor', 'qk_dim': 4, 'window': 4}  # a small Based hybrid's options


def model(mechanism, options=None, depth=2, n=12, decode=False):
  config = TransformerConfig(
    d_model=16,
    depth=depth,
    num_heads=2,
    mlp_dim=32,
    mechanism=mechanism,
    options=options,
    max_length=n,
  )
  return CausalTransformer(config, vocab_size=10, decode=decode)


def tokens(n=12):
  return jax.random.randint(jax.random.PRNGKey(0), (2, n), 0, 11)


def test_names_and_options_are_shared_out_by_mechanism():
  assert hybrid.names('linear+local') == ('linear', 'local')
  assert hybrid.name(hybrid.declarations('linear+local')) == 'linear+local'
  linear, local = hybrid.split_options('linear+local', BASED)
  assert linear == {'feature_map': 'taylor', 'qk_dim': 4} and local == {'window': 4}
  with pytest.raises(
    ValueError,
    match=r"^option 'num_landmarks' is not an option of any "
    r"mechanism of 'linear\+local'; their options: .*window",
  ):
    hybrid.split_options('linear+local', {'num_landmarks': 8})
  with pytest.raises(ValueError, match=r"^options 'k_proj', 'num_landmarks' are not"):
    hybrid.split_options('linear+local', {'num_landmarks': 8, 'k_proj': 4})
  assert hybrid.unregistered('linear++lcoal') == ('', 'lcoal')
  with pytest.raises(ValueError, match="'linear\\+' is not valid: a pattern names"):
    hybrid.declarations('linear+')
  with pytest.raises(
    ValueError,
    match=r"Unknown attention mechanism 'linear\+local' \(a "
    r'pattern .* a layer takes one\)',
  ):
    registry.get_mechanism('linear+local')


def test_options_two_mechanisms_declare_with_their_own_defaults_come_back_their_own():
  """linear's chunk_size defaults to None, GLA's to 64: the merged options (config.json's)
  leave it out, so reading them back gives each its own default again."""
  layers = hybrid.configure('linear+gla', {'eps': 1e-5}, causal=True)
  merged = hybrid.merged_options(layers)
  assert 'chunk_size' not in merged and merged['eps'] == 1e-5
  again = hybrid.configure('linear+gla', merged, causal=True)
  assert [dict(options) for _, options in again] == [dict(options) for _, options in layers]


def test_a_pattern_of_one_mechanism_twice_is_the_plain_stack():
  """Linformer with E = F shared by every layer: the one shared projection, named as in
  the plain stack, and the same output on the same weights."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 16))
  options = {'sharing': 'layerwise', 'k_proj': 4}
  plain, twice = (
    Encoder(
      TransformerConfig(
        d_model=16, depth=2, num_heads=2, mlp_dim=32, mechanism=m, options=options, max_length=8
      )
    )
    for m in ('linformer', 'linformer+linformer')
  )
  params = jax.jit(plain.init)(jax.random.PRNGKey(1), x)
  assert 'shared_attention_kv_proj' in params['params']
  shapes = jax.eval_shape(twice.init, jax.random.PRNGKey(1), x)  # the tree, nothing to compute
  assert jax.tree.structure(shapes) == jax.tree.structure(params)
  np.testing.assert_array_equal(jax.jit(twice.apply)(params, x), jax.jit(plain.apply)(params, x))
  mixed = Encoder(
    TransformerConfig(
      d_model=16,
      depth=2,
      num_heads=2,
      mlp_dim=32,
      mechanism='linformer+softmax',
      options=options,
      max_length=8,
    )
  )
  mixed = jax.eval_shape(mixed.init, jax.random.PRNGKey(1), x)
  assert 'shared_attention_linformer_kv_proj' in mixed['params']  # two mechanisms: by name


def test_each_block_takes_its_mechanism_and_options_in_turn():
  """At depth 4, blocks 0 and 2 are Taylor linear attention with qk_dim 4, blocks 1 and
  3 local attention; a window as long as the sequence makes local attention causal
  softmax, so the stack equals 'linear+softmax' on the same weights."""
  x = tokens()
  long_window = dict(BASED, window=12)
  params = jax.jit(model('linear+local', long_window, depth=4).init)(jax.random.PRNGKey(1), x)
  widths = [
    params['params']['decoder'][f'block_{i}']['attention']['key']['kernel'].shape[-1]
    for i in range(4)
  ]
  assert widths == [4, 8, 4, 8]  # qk_dim reached the linear blocks only
  y = jax.jit(model('linear+local', long_window, depth=4).apply)(params, x)
  softmax = model('linear+softmax', {'feature_map': 'taylor', 'qk_dim': 4}, depth=4)
  np.testing.assert_allclose(y, jax.jit(softmax.apply)(params, x), atol=2e-5)
  elu = model('linear+local', dict(long_window, feature_map='elu'), depth=4)
  assert np.abs(jax.jit(elu.apply)(params, x) - y).max() > 1e-3  # the feature map reached them


def test_decoding_a_pattern_token_by_token_equals_its_parallel_form():
  """A recurrent state (Taylor linear attention) beside a sliding window's cache (window 4
  of 12 tokens): the tokens one at a time give the full forward's logits."""
  x = tokens()
  params = jax.jit(model('linear+local', BASED).init)(jax.random.PRNGKey(1), x)['params']
  full = jax.jit(model('linear+local', BASED).apply)({'params': params}, x)
  stepper = model('linear+local', BASED, decode=True)
  cache = jax.jit(stepper.init)(jax.random.PRNGKey(1), x)['cache']
  step = jax.jit(functools.partial(stepper.apply, mutable=['cache']))  # compiled once
  steps = []
  for t in range(x.shape[1]):
    y, changed = step({'params': params, 'cache': cache}, x[:, t : t + 1])
    cache = changed['cache']
    steps.append(y)
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=2e-5)


def test_padded_tokens_move_no_other_output_of_a_bidirectional_pattern():
  """An encoder of linear and local attention (window 4 of 12 tokens) with key padding: what
  the padded tokens hold changes no real token's output."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 12, 16))
  valid = np.arange(12)[None, :] < np.array([[8], [12]])  # the first sequence: 4 padded
  encoder = Encoder(
    TransformerConfig(
      d_model=16, depth=2, num_heads=2, mlp_dim=32, mechanism='linear+local', options={'window': 4}
    )
  )
  params = jax.jit(encoder.init)(jax.random.PRNGKey(1), x, mask=valid)
  moved = x.at[0, 8:].set(100.0)
  apply = jax.jit(encoder.apply)  # one program for both inputs
  y, y_moved = (apply(params, z, mask=valid) for z in (x, moved))
  np.testing.assert_allclose(y_moved[0, :8], y[0, :8], atol=1e-5)
  np.testing.assert_array_equal(y_moved[1], y[1])
  assert np.abs(y_moved[0, 8:] - y[0, 8:]).max() > 1e-2  # the padded rows did change


def test_a_causal_only_block_makes_the_stack_causal_there():
  assert TransformerConfig(mechanism='softmax+gla').attention_causal
  assert not TransformerConfig(mechanism='softmax+linear').attention_causal


def test_depth_the_pattern_does_not_divide_and_reversible_are_refused_by_the_stack():
  x = tokens()
  with pytest.raises(
    ValueError,
    match=r"gives blocks 2 mechanisms in turn, which does not "
    r'divide depth=3; valid depths: multiples of 2',
  ):
    model('linear+local', depth=3).init(jax.random.PRNGKey(1), x)
  reversible = Encoder(
    TransformerConfig(
      d_model=16, depth=2, num_heads=2, mlp_dim=32, mechanism='softmax+linear', reversible=True
    )
  )
  with pytest.raises(
    ValueError,
    match=r"^reversible=True with mechanism 'softmax\+linear': "
    r'the reversible stack takes one mechanism; valid: reversible=False',
  ):
    reversible.init(jax.random.PRNGKey(1), jax.numpy.ones((1, 8, 16)))
  same = Encoder(
    TransformerConfig(
      d_model=16, depth=2, num_heads=2, mlp_dim=32, mechanism='softmax+softmax', reversible=True
    )
  )
  # One mechanism: reversible (built and traced; its refusals above come while tracing).
  jax.eval_shape(same.init, jax.random.PRNGKey(1), jax.numpy.ones((1, 8, 16)))


# The config (configs/mqar.py as main.py builds it)

TINY = 'd_model=16,seq_len=16,num_kv_pairs=2,vocab_size=32,num_train=256'


def parse(arg, *args):
  return main_runner.parsed_config(f'configs/mqar.py:{arg},{TINY}', *args)


def based_args(window=4):
  return (
    '--config.attention.options.feature_map=taylor',
    '--config.attention.options.qk_dim=4',
    f'--config.attention.options.window={window}',
  )


def test_the_config_resolves_a_pattern_and_reads_its_record_back():
  r = validate.resolve(parse('linear+local', *based_args()), read_data=False)
  assert hybrid.names(r.mechanism) == ('linear', 'local')
  assert (r.options['feature_map'], r.options['qk_dim'], r.options['window']) == ('taylor', 4, 4)
  again = validate.resolve(r.config, read_data=False)  # as config.json is read back
  assert dict(again.options) == dict(r.options)


def test_options_two_mechanisms_declare_name_the_model_where_it_is_not_both_defaults():
  """GLA's conv_size defaults to 0, DeltaNet's to 4: conv_size=0 changes the model (its
  label says so) and reads back from config.json as it was set; the defaults name none."""
  labels = {}
  for args in ((), ('--config.attention.options.conv_size=0',)):
    r = validate.resolve(parse('gla+deltanet', *args), read_data=False)
    again = validate.resolve(r.config, read_data=False)
    assert dict(again.options) == dict(r.options)
    labels[args] = run_records.label(r.config)
  assert list(labels.values()) == ['gla+deltanet', 'gla+deltanet conv_size=0']


@pytest.mark.parametrize(
  'arg, args, message',
  [
    (
      'linear+lcoal',
      (),
      r"^config.attention.mechanism='linear\+lcoal' is not valid \('lcoal' "
      r"is not a mechanism\); valid choices: softmax, .*, or several joined by '\+'",
    ),
    (
      'linear++local',
      (),
      r"^config.attention.mechanism='linear\+\+local' is not valid \(an "
      r'empty name\)',
    ),
    (
      'linear+local',
      ('--config.model.depth=3',),
      r"^config.model.depth=3: mechanism 'linear\+local' gives blocks 2 mechanisms in turn",
    ),
    (
      'linear+local',
      ('--config.attention.options.num_landmarks=8',),
      r"^config.attention: option 'num_landmarks' is not an option of any mechanism of "
      r"'linear\+local'",
    ),
    ('linear+local', ('--config.attention.options.window=0',), r"^config.attention: .*window=0"),
  ],
)
def test_a_pattern_the_config_cannot_build_is_one_line(arg, args, message):
  with pytest.raises(validate.ConfigError, match=message) as e:
    validate.resolve(parse(arg, *args), read_data=False)
  assert '\n' not in str(e.value)


def test_a_mechanism_without_a_causal_form_in_a_pattern_is_named():
  with pytest.raises(SystemExit) as e:
    parse('linear+nystrom')
  assert "configs/mqar.py: mechanism 'nystrom' (of 'linear+nystrom') has no causal form" in (
    str(e.value)
  ) and '\n' not in str(e.value)


def test_reversible_and_samples_a_block_cannot_decode_are_refused():
  config = main_runner.parsed_config(
    'configs/default.py',
    '--config.model.reversible=True',
    '--config.attention.mechanism=softmax+linear',
  )
  with pytest.raises(
    validate.ConfigError,
    match=r"^config.model.reversible=True with "
    r"mechanism 'softmax\+linear': the reversible stack takes one",
  ):
    validate.resolve(config, read_data=False)
  config = main_runner.parsed_config(
    'configs/bytelm.py:linear+sparse,d_model=16,seq_len=32,data_dir=x.npz'
  )
  with pytest.raises(
    validate.ConfigError,
    match=r"^config.attention.mechanism='linear\+"
    r"sparse' \(its mechanism 'sparse'\) has no decoding form, which the "
    r'continuations',
  ):
    validate.resolve(config, read_data=False)


def test_the_decode_state_of_a_pattern_is_its_blocks_states():
  """'linear+local' at depth 2 holds one linear state and one window: half of the two
  plain stacks' caches (each counts its one position counter)."""
  sizes = {
    m: decode_state.state_bytes(
      parse(
        m,
        *based_args()[:2] if m == 'linear' else based_args()[2:] if m == 'local' else based_args(),
      )
    )
    for m in ('linear', 'local', 'linear+local')
  }
  assert sizes['linear+local'] == (sizes['linear'] + sizes['local']) // 2


@pytest.mark.slow
def test_a_tiny_mqar_run_trains_a_pattern(tmp_path):
  workdir = str(tmp_path / 'run')
  config = parse(
    'linear+local,num_steps=4',
    *based_args(),
    '--config.train.log_every=2',
    f'--config.dataset.data_dir={tmp_path}/data',
    '--config.dataset.sizes.validation=64',
    '--config.dataset.sizes.test=64',
  )
  trainer.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'results.json')) as f:
    results = json.load(f)
  assert results['steps'] == 4 and np.isfinite(results['eval_loss'])
  assert run_records.label(config) == 'linear+local feature_map=taylor qk_dim=4 window=4'

"""Context parallelism (`efficient_attn.layers.parallel`): a layer with `sequence_axis`
equals itself without one, and refuses in one line what it cannot split.

The equalities run on 8 host-platform CPU devices, in two subprocesses (XLA_FLAGS must be
set before jax is imported) that each compile half the cases, each case once: outputs and
gradients (inputs and every parameter) of the sequence-split layer against the
single-device layer, for every mechanism that declares a `sequence_parallel` form, causal
and bidirectional where it has them, with left and right key padding that cross device
boundaries. The refusals are traced in this process under an abstract mesh
(`jax.sharding.use_abstract_mesh`): no devices, no compilation.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import main_runner
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.layers import parallel
from efficient_attn.models import Encoder
from efficient_attn.models import TransformerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Extra cases beyond each mechanism's forms: (mechanism, causal, tag, options, layer args).
VARIANTS = (
  ('rfa', True, 'gate', {'use_gate': True, 'learn_sigma': True}, {}),
  ('linear', True, 'rotary', {}, {'rotary': True}),  # 'features' rotary
  ('retention', True, 'rotary', {}, {'rotary': True}),  # 'scores' rotary
  ('performer', True, 'redraw', {'redraw': True}, {}),  # a key drawn outside
  ('local', True, 'wide', {'window': 20}, {}),  # a halo of 3 devices
  ('local', False, 'wide', {'window': 21}, {}),
  ('mamba2', True, 'groups', {'ngroups': 1, 'conv_bias': False}, {}),
  ('deltanet', True, 'naive', {'form': 'naive'}, {}),
)


def forms(decl):
  return [True] if decl.causal_only else [True, False] if decl.causal else [False]


def case_name(mechanism: str, causal: bool, tag: str = '') -> str:
  return '-'.join([mechanism, 'causal' if causal else 'bidirectional'] + ([tag] if tag else []))


def cases():
  """{name: (mechanism, causal, options, layer args)}: every declared form, then VARIANTS."""
  out = {}
  for decl in registry.mechanisms():
    if decl.sequence_parallel:
      for causal in forms(decl):
        out[case_name(decl.name, causal)] = (decl.name, causal, {}, {})
  for mechanism, causal, tag, options, args in VARIANTS:
    out[case_name(mechanism, causal, tag)] = (mechanism, causal, options, args)
  return out


# Runs in a fresh process with 8 CPU devices. argv[1]: the cases as JSON. Prints one JSON
# line per case: {"case", "error" (`compare`'s, over outputs and gradients: <= 1 passes),
# "where", "seconds"} or {"case", "failed"}.
SCRIPT = r'''
import json, sys, time, traceback
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
import efficient_attn as ea
import efficient_attn.nnx as ean
from efficient_attn import registry
from efficient_attn.models import Encoder, TransformerConfig
assert jax.device_count() == 8, jax.devices()
Explicit, Auto = jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto
MESH = jax.make_mesh((2, 4), ('data', 'sequence'), axis_types=(Explicit, Explicit))
SIX = jax.sharding.Mesh(np.array(jax.devices()[:6]).reshape(1, 6), ('data', 'sequence'),
                        axis_types=(Auto, Auto))   # not a power of 2, automatic axes
TWO = jax.sharding.Mesh(np.array(jax.devices()[:2]).reshape(1, 2), ('data', 'sequence'),
                        axis_types=(Auto, Auto))   # the Pallas kernels' interpreter: few threads

def small(decl, options):
  """The example options, with chunks small enough that each device has several."""
  example = dict(decl.example)
  names = {opt.name for opt in decl.options}
  if 'chunk_size' in names:
    example['chunk_size'] = 4
  if 'q_chunk' in names:
    example.update(q_chunk=4, k_chunk=2)
  example.update(options)
  return example

def inputs(n, dtype, batch=2):
  x = jax.random.normal(jax.random.key(0), (batch, n, 8), dtype)
  valid = np.ones((batch, n), bool)
  valid[0, :n // 3] = False        # left padding across the first device's block
  valid[1, -(n // 3):] = False     # right padding across the last one's
  return x, jnp.asarray(valid)

def compare(single, sharded):
  """max |sharded - single| / (1e-5 (1 + max |single|)) over the leaves (each leaf to 1e-5
  of its own scale: a gradient entry that cancels to ~0 is held to its leaf's rounding)."""
  worst, where = 0.0, ''
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(single), jax.tree.leaves(sharded)):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err = float(np.max(np.abs(a - b)) / (1e-5 * (1 + np.max(np.abs(a))))) if a.size else 0.0
    if not np.isfinite(err) or err > worst:
      worst, where = err, jax.tree_util.keystr(path)
  return worst, where

def init(module, *args, **kwargs):
  """The module's variables from key 1, in one compiled program (an eager init compiles
  every operation alone)."""
  return jax.jit(lambda: module.init(jax.random.key(1), *args, **kwargs))()

def linen_case(mechanism, causal, options, args, mesh=MESH, n=32, dtype=jnp.float32, batch=2,
               packed=False):
  decl = registry.get_mechanism(mechanism)
  x, valid = inputs(n, dtype, batch)
  feed = dict(mask=valid)
  if packed:   # documents across the device blocks (of 8), padding inside one and after one
    runs = [[1, 2, 0, 2, 3], [4, 4, 5, 0, 6]]
    feed = dict(segment_ids=jnp.asarray(np.repeat(runs, [5, 9, 3, 6, 9], axis=1)))
  make = lambda axis: ea.MultiHeadAttention(
      num_heads=2, mechanism=mechanism, options=small(decl, options), causal=causal,
      max_length=n, sequence_axis=axis, param_dtype=dtype, **args)
  single, split = make(None), make('sequence')
  params = init(single, x, **feed)
  # Redrawn features: a training call with a 'features' stream, the same key for both.
  train = dict(deterministic=False, rngs={'features': jax.random.key(2)})
  call = train if options.get('redraw') else {}
  def loss(layer):
    def f(p, x):
      y = layer.apply(p, x, **feed, **call)
      return jnp.sum(jnp.sin(y)) / x.shape[0], y
    return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)
  both = jax.jit(lambda p, x: (loss(single)(p, x), loss(split)(p, x)))
  with jax.set_mesh(mesh):
    return both(params, x)

def nnx_case(mechanism, causal):
  x, valid = inputs(32, jnp.float32)
  make = lambda axis: ean.MultiHeadAttention(
      num_heads=2, in_features=8, mechanism=mechanism, causal=causal, sequence_axis=axis,
      options=small(registry.get_mechanism(mechanism), {}), rngs=nnx.Rngs(0))
  def loss(layer):
    graph, state = nnx.split(layer)
    def f(state, x):
      y = nnx.merge(graph, state)(x, mask=valid)
      return jnp.sum(jnp.sin(y)), y
    return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(state, x)
  with jax.set_mesh(MESH):
    return jax.jit(lambda x: (loss(make(None)), loss(make('sequence'))))(x)

DATA2 = {kind: jax.sharding.Mesh(np.array(jax.devices()[:2]), ('data',), axis_types=(kind,))
         for kind in (Auto, Explicit)}

def rows_case(mechanism, causal, kind):
  """The unsplit layer's Pallas kernel under a data-parallel mesh of 2 devices (its batch
  split over 'data' in a shard_map) against the same call without a mesh."""
  decl = registry.get_mechanism(mechanism)
  x, valid = inputs(32, jnp.float32)
  layer = ea.MultiHeadAttention(num_heads=2, mechanism=mechanism, causal=causal,
                                options=small(decl, {'implementation': 'pallas'}),
                                max_length=32)
  params = init(layer, x, mask=valid)
  def f(p, x):
    y = layer.apply(p, x, mask=valid)
    return jnp.sum(jnp.sin(y)), y
  g = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))
  alone = g(params, x)
  mesh = DATA2[kind]
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.P('data')))
    jaxpr = str(jax.make_jaxpr(g)(params, xs))
    assert 'shard_map' in jaxpr and 'pallas_call' in jaxpr, 'the kernel call is not split'
    return alone, g(params, xs)

def zigzag_case():
  """to_zigzag puts chunks i and 2n - 1 - i on device i and from_zigzag undoes it; in the
  causal ring (forward and backward) no visiting block costs more than m x m / 2 scores."""
  from efficient_attn.ops import collectives
  from efficient_attn.mechanisms import softmax as softmax_mechanism
  n, m = 4, 6
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ('s',), axis_types=(Auto,))
  x = jnp.arange(n * m, dtype=jnp.float32)[None]
  there = jax.shard_map(lambda a: collectives.to_zigzag(a, 's'), mesh=mesh,
                        in_specs=jax.P(None, 's'), out_specs=jax.P(None, 's'))(x)
  back = jax.shard_map(lambda a: collectives.from_zigzag(a, 's'), mesh=mesh,
                       in_specs=jax.P(None, 's'), out_specs=jax.P(None, 's'))(there)
  h = m // 2
  expected = [np.arange(c * h, (c + 1) * h) for i in range(n) for c in (i, 2 * n - 1 - i)]
  assert np.array_equal(np.asarray(there).reshape(-1), np.concatenate(expected)), there
  seen = []
  dense = softmax_mechanism.DENSE_BLOCK
  def forward(q, k, v, kp, causal):
    seen.append((q.shape[1], k.shape[1], bool(causal)))
    return dense.forward(q, k, v, kp, causal)
  def backward(q, k, v, kp, causal, *rest):
    seen.append((q.shape[1], k.shape[1], bool(causal)))
    return dense.backward(q, k, v, kp, causal, *rest)
  block = collectives.RingBlock(forward, backward)
  q = jax.random.normal(jax.random.key(0), (1, n * m, 1, 4))
  ring = jax.shard_map(
      lambda q: collectives.ring_attention(q, q, q, None, causal=True, axis='s', block=block),
      mesh=mesh, in_specs=jax.P(None, 's'), out_specs=jax.P(None, 's'), check_vma=False)
  jax.jit(jax.grad(lambda q: jnp.sum(ring(q))))(q)   # one compilation, not one per operation
  visits = {(a, b) for a, b, causal in seen if not causal}
  assert visits == {(m, h), (h, m)}, seen
  return (x,), (back,)

def encoder_case(mechanism, causal, reversible=False):
  x, valid = inputs(32, jnp.float32)
  config = TransformerConfig(d_model=8, depth=2, num_heads=2, mlp_dim=16, mechanism=mechanism,
                             causal=causal, max_length=32, reversible=reversible,
                             options={'window': 6, 'chunk_size': 4} if '+' in mechanism
                             else small(registry.get_mechanism(mechanism), {}))
  single, split = Encoder(config), Encoder(config.replace(sequence_axis='sequence'))
  params = init(single, x, mask=valid)
  def loss(model):
    f = lambda p, x: (jnp.sum(jnp.sin(model.apply(p, x, mask=valid))),) * 2
    return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)
  with jax.set_mesh(MESH):
    assert 'shard_map' in str(jax.make_jaxpr(loss(split))(params, x)), 'not split'
    return jax.jit(lambda p, x: (loss(single)(p, x), loss(split)(p, x)))(params, x)

for name, (mechanism, causal, options, args) in json.loads(sys.argv[1]).items():
  start = time.process_time()
  try:
    if name.startswith('nnx:'):
      single, sharded = nnx_case(mechanism, causal)
    elif name == 'zigzag:layout':
      single, sharded = zigzag_case()
    elif name.startswith('rows:'):
      single, sharded = rows_case(mechanism, causal,
                                  Explicit if name.endswith('-explicit') else Auto)
    elif name.startswith('encoder:'):
      single, sharded = encoder_case(mechanism, causal, name.endswith('-reversible'))
    elif name.endswith('-x64'):
      with jax.enable_x64(True):
        single, sharded = linen_case(mechanism, causal, options, args, dtype=jnp.float64)
    elif name.endswith('-packed'):
      single, sharded = linen_case(mechanism, causal, options, args, packed=True)
    elif name.endswith('-odd'):   # 7 tokens a device: the causal ring stays contiguous
      single, sharded = linen_case(mechanism, causal, options, args, n=28)
    elif name.endswith('-batch3'):   # 'data' (2) does not divide it: the rows are replicated
      single, sharded = linen_case(mechanism, causal, options, args, batch=3)
    elif name.endswith('-6'):
      single, sharded = linen_case(mechanism, causal, options, args, mesh=SIX, n=48)
    elif name.endswith('-2'):
      single, sharded = linen_case(mechanism, causal, options, args, mesh=TWO, n=32)
    else:
      single, sharded = linen_case(mechanism, causal, options, args)
    error, where = compare(single, sharded)
    if name.endswith('-x64'):
      error *= 1e-5 / 1e-10   # float64: to 1e-10
    print(json.dumps({'case': name, 'error': error, 'where': where,
                      'seconds': time.process_time() - start}), flush=True)
  except Exception:  # reported per case
    print(json.dumps({'case': name, 'failed': traceback.format_exc()[-3000:]}), flush=True)
'''

# Cases beside the Linen ones: the NNX layer; the encoder (TransformerConfig.sequence_axis, a
# pattern of two mechanisms; reversible blocks, whose backward recomputes each block); 48 tokens
# over 6 devices of an automatic mesh; a batch of 3 rows that the 'data' axis (2) does not divide,
# replicated over it (issue 70, item 10: a shard_map error before); the gated recurrences' Pallas
# kernels on each block in interpret mode over 2 devices of an automatic mesh (the interpreter runs
# Python on every device thread: with 6 of them on a busy 2-core machine one thread missed XLA's
# 40-s collective deadline); the causal ring's zigzag layout and the size of every visit it
# computes, and the contiguous ring it keeps for an odd number of tokens a device; the unsplit
# layer's kernel on a data-parallel mesh of 2 devices, automatic or explicit
# (`kernels.common.per_device` splits the batch in a shard_map: XLA would run all of it on every
# device); float64 identities (to 1e-10) for softmax, RFA and local; and Forgetting Attention's
# ring on packed rows (documents and forget sums across the device blocks) and, with its dense
# block, contiguous; linear attention and gated RFA on packed rows (their sums restart at each
# document, across the device blocks).
EXTRA = {
  'nnx:linear-bidirectional': ('linear', False, {}, {}),
  'encoder:linear+local-causal': ('linear+local', True, {}, {}),
  'encoder:gated_deltanet-causal-reversible': ('gated_deltanet', True, {}, {}),
  'gated_deltanet-causal-pallas-2': ('gated_deltanet', True, {'implementation': 'pallas'}, {}),
  'gla-causal-pallas-2': ('gla', True, {'implementation': 'pallas'}, {}),
  'zigzag:layout': ('softmax', True, {}, {}),
  'rows:gated_deltanet-causal': ('gated_deltanet', True, {}, {}),
  'rows:gla-causal-explicit': ('gla', True, {}, {}),
  'softmax-causal-6': ('softmax', True, {}, {}),
  'softmax-causal-batch3': ('softmax', True, {}, {}),
  'linear-causal-batch3': ('linear', True, {}, {}),
  'softmax-causal-odd': ('softmax', True, {}, {}),
  'softmax-causal-x64': ('softmax', True, {}, {}),
  'rfa-causal-x64': ('rfa', True, {'use_gate': True}, {}),
  'local-bidirectional-x64': ('local', False, {'window': 21}, {}),
  'forgetting-causal-packed': ('forgetting', True, {}, {}),
  'linear-causal-packed': ('linear', True, {}, {}),
  'rfa-causal-packed': ('rfa', True, {'use_gate': True}, {}),
  'forgetting-causal-odd': ('forgetting', True, {'form': 'dense'}, {}),
}


PARTS = 2  # subprocesses, each running every PARTS-th case: one per worker of CI's `-n 2`


def _run_cases(todo, workdir):
  """Runs the cases `todo` in one subprocess with 8 CPU devices; its stdout to workdir."""
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=f'{main_runner.XLA_FLAGS} --xla_force_host_platform_device_count=8',
  )
  proc = subprocess.run(
    [sys.executable, '-c', SCRIPT, json.dumps(todo)],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  with open(os.path.join(workdir, 'stdout'), 'w') as f:
    f.write(proc.stdout)
  assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope='module')
def results(run_once):
  """{case: its JSON line}, from PARTS subprocesses run once per session and shared by the
  pytest-xdist workers through `run_once`. Each worker starts with a different part, so two
  workers run two parts at once where one used to wait for the other's single subprocess."""
  todo = list({**cases(), **EXTRA}.items())
  worker = int(os.environ.get('PYTEST_XDIST_WORKER', 'gw0')[len('gw') :])
  out = {}
  for i in range(PARTS):
    part = (worker + i) % PARTS
    workdir = run_once(
      f'sequence_parallel_{part}', functools.partial(_run_cases, dict(todo[part::PARTS]))
    )
    with open(os.path.join(workdir, 'stdout')) as f:
      for line in f.read().splitlines():
        if line.startswith('{'):
          record = json.loads(line)
          out[record['case']] = record
  return out


@pytest.mark.parametrize('case', list(cases()) + list(EXTRA))
def test_split_sequence_equals_one_device(results, case):
  record = results.get(case)
  assert record is not None, f'{case} did not run'
  assert 'failed' not in record, record.get('failed')
  assert record['error'] <= 1.0, (
    f'{case}: sharded differs from single-device at '
    f'{record["where"]} ({record["error"]:.3g} x tolerance)'
  )


def test_every_form_is_declared_and_each_other_mechanism_says_why():
  forms_seen = set()
  for decl in registry.mechanisms():
    assert decl.sequence_parallel in registry.SEQUENCE_FORMS
    forms_seen.add(decl.sequence_parallel)
    if not decl.sequence_parallel:
      assert decl.whole_sequence != registry.Mechanism.whole_sequence, decl.name
  assert forms_seen == set(registry.SEQUENCE_FORMS)


# The refusals: traced under an abstract mesh, so no devices are needed.

X = jnp.zeros((2, 32, 8))


def _trace(layer, x=X, mesh=(('sequence', 4),), **call):
  """Traces `layer.init` under an abstract mesh of `mesh` ((name, size) pairs; None: none)."""
  keys = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  run = lambda: jax.eval_shape(lambda: layer.init(keys, x, **call))
  if mesh is None:
    return run()
  names, sizes = zip(*mesh)
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh(sizes, names)):
    return run()


def _layer(mechanism='softmax', **kwargs):
  decl = registry.get_mechanism(mechanism)
  return ea.MultiHeadAttention(
    num_heads=2,
    mechanism=mechanism,
    options=dict(decl.example),
    causal=decl.causal_only,
    max_length=32,
    sequence_axis='sequence',
    **kwargs,
  )


def test_a_split_layer_traces_under_an_abstract_mesh():
  shapes = _trace(_layer('gla'))
  assert shapes['params']['out']['kernel'].shape == (2, 4, 8)


@pytest.mark.parametrize('mechanism', registry.names_where(lambda m: not m.sequence_parallel))
def test_a_mechanism_without_a_form_refuses(mechanism):
  decl = registry.get_mechanism(mechanism)
  with pytest.raises(ValueError) as e:
    _trace(_layer(mechanism))
  message = str(e.value)
  assert message == (
    f"mechanism {mechanism!r} cannot split the sequence over mesh axis "
    f"'sequence': {decl.whole_sequence}; mechanisms that can: "
    f"{', '.join(parallel.supporting())}"
  )
  assert '\n' not in message


@pytest.mark.parametrize(
  'setting, call, mesh, expected',
  [
    (
      {},
      {},
      None,
      "sequence_axis='sequence' needs a mesh: call the layer inside `with "
      "jax.set_mesh(mesh):`, with a mesh that has the axis 'sequence'",
    ),
    (
      {},
      {},
      (('data', 2), ('fsdp', 4)),
      "sequence_axis='sequence' is not an axis of the mesh; valid: 'data', 'fsdp'",
    ),
    (
      {},
      {'x': jnp.zeros((2, 30, 8))},
      (('sequence', 4),),
      'sequence length 30 is not '
      "divisible by the 4 devices of mesh axis 'sequence'; pad it to a multiple of 4",
    ),
    (
      {},
      {'inputs_k': jnp.zeros((2, 16, 8))},
      (('sequence', 4),),
      "sequence_axis='sequence' "
      'splits one sequence (self-attention); got q_length=32 and kv_length=16',
    ),
    (
      {},
      {'mask': jnp.ones((2, 1, 32, 32), bool)},
      (('sequence', 4),),
      "sequence_axis='sequence' takes key padding only ([batch, length] or [batch, 1, 1, "
      'length]), not a mask of shape (2, 1, 32, 32); ask for causality with causal=True',
    ),
    (
      {},
      {'sow_weights': True},
      (('sequence', 4),),
      "sow_weights=True with "
      "sequence_axis='sequence': the attention weights [length, length] are never formed on "
      'one device; valid: sow_weights=False, or sequence_axis=None',
    ),
    (
      {'dropout_rate': 0.1},
      {'deterministic': False},
      (('sequence', 4),),
      "dropout_rate=0.1 with sequence_axis='sequence': attention-weight dropout in training "
      'is not split over devices; valid: dropout_rate=0, or sequence_axis=None',
    ),
  ],
)
def test_refusals_are_one_line(setting, call, mesh, expected):
  x = call.pop('x', X)
  with pytest.raises(ValueError) as e:
    _trace(_layer(**setting), x, mesh, **call)
  assert str(e.value) == expected


def test_without_dropout_in_evaluation_the_layer_splits():
  _trace(_layer(dropout_rate=0.1), deterministic=True)


def test_the_nnx_layer_and_the_encoder_read_the_axis():
  from flax import nnx  # pylint: disable=g-import-not-at-top

  import efficient_attn.nnx as ean  # pylint: disable=g-import-not-at-top

  layer = ean.MultiHeadAttention(
    num_heads=2, in_features=8, mechanism='nystrom', sequence_axis='sequence', rngs=nnx.Rngs(0)
  )
  with pytest.raises(ValueError, match="mechanism 'nystrom' cannot split the sequence"):
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((4,), ('sequence',))):
      jax.eval_shape(layer, X)
  encoder = Encoder(
    TransformerConfig(
      d_model=8, depth=1, num_heads=2, mlp_dim=8, mechanism='fnet', sequence_axis='sequence'
    )
  )
  with pytest.raises(ValueError, match="mechanism 'fnet' cannot split the sequence"):
    _trace(encoder)


def test_a_decoding_step_is_not_split():
  layer = ea.MultiHeadAttention(
    num_heads=2,
    mechanism='gla',
    causal=True,
    decode=True,
    options={'chunk_size': 4},
    sequence_axis='sequence',
  )
  x = jax.random.normal(jax.random.key(0), (2, 8, 8))
  mesh = jax.make_mesh((1,), ('sequence',))
  with jax.set_mesh(mesh):
    variables = jax.jit(layer.init)(jax.random.key(1), x)
    cache = variables['cache']
    step = jax.jit(functools.partial(layer.apply, mutable=['cache']))  # not op by op
    for t in range(2):  # one token at a time, as without a sequence axis
      y, mutated = step({**variables, 'cache': cache}, x[:, t : t + 1])
      cache = mutated['cache']
  assert y.shape == (2, 1, 8) and np.all(np.isfinite(y))

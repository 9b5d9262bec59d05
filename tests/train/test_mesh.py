"""The mesh from `config.train.mesh` (train/mesh.py): its refusals, the FSDP rule, and
training on 8 CPU devices (data x fsdp x sequence) equal to one device, resumed on
another mesh, and across two processes.

The 8-device checks run in one subprocess (XLA_FLAGS must be set before jax is
imported). Their model is a one-block causal softmax Transformer on a tiny MQAR
(16 tokens, batch 16), trained with SGD with momentum: AdamW divides by sqrt(v), so a
gradient that is zero in exact arithmetic (softmax's key bias) moves by lr-sized steps
of either sign under round-off, whatever the mesh; SGD's step is proportional to the
gradient, so the parameters agree as closely as the losses do.
"""

import json
import os
import re
import subprocess
import sys

import jax
import main_runner
import numpy as np
import pytest

from train import loop as loop_lib
from train import mesh as mesh_lib
from train import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MESH = {'data': 2, 'fsdp': 2, 'sequence': 2}
ARG = 'softmax,d_model=32,seq_len=16,num_kv_pairs=2,vocab_size=32,num_train=256,num_steps=4'


# ----------------------------------------------------------------------------
# Refusals and the FSDP rule, in this process (no devices needed).
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  'spec, fragment',
  [
    (
      {'data': 2, 'model': 4},
      "config.train.mesh={'data': 2, 'model': 4} has an unknown axis "
      "'model'; valid axes: data, fsdp, sequence",
    ),
    (
      {'fsdp': 0},
      "config.train.mesh['fsdp']=0 is not valid; it must be an integer >= 1, or "
      "-1 for the devices the other axes leave",
    ),
    ({'sequence': -2}, "config.train.mesh['sequence']=-2 is not valid"),
    ({'fsdp': 2.0}, "config.train.mesh['fsdp']=2.0 is not valid"),
    (
      {'data': -1, 'fsdp': -1},
      "config.train.mesh={'data': -1, 'fsdp': -1, 'sequence': 1} has "
      "-1 in 'data' and 'fsdp'; at most one axis may take the "
      "remaining devices",
    ),
  ],
)
def test_a_bad_mesh_is_refused_in_one_line_by_validation(spec, fragment):
  config = main_runner.config()
  config.train.mesh = spec
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(config)
  assert fragment in str(e.value) and '\n' not in str(e.value)


def test_axes_left_out_take_their_defaults():
  assert mesh_lib.check_spec(None) == {'data': -1, 'fsdp': 1, 'sequence': 1}
  assert mesh_lib.check_spec({'fsdp': 2}) == {'data': -1, 'fsdp': 2, 'sequence': 1}
  assert mesh_lib.check_spec({'sequence': -1}) == {'data': 1, 'fsdp': 1, 'sequence': -1}
  assert loop_lib.check(main_runner.config()).mesh == {'data': -1, 'fsdp': 1, 'sequence': 1}
  assert mesh_lib.resolve({'fsdp': 2}, 8) == {'data': 4, 'fsdp': 2, 'sequence': 1}
  assert mesh_lib.resolve({'data': 2, 'fsdp': 2, 'sequence': 2}, 8)['sequence'] == 2


@pytest.mark.parametrize(
  'spec, fragment',
  [
    (
      {'data': 3},
      "config.train.mesh={'data': 3, 'fsdp': 1, 'sequence': 1} needs 3 devices, "
      "but there are 8 devices; valid: sizes whose product is 8, or one axis of -1",
    ),
    (
      {'fsdp': 3},
      "config.train.mesh={'data': -1, 'fsdp': 3, 'sequence': 1} does not fit 8 "
      "devices: the fixed axes (3 devices) must divide the device count",
    ),
  ],
)
def test_a_mesh_the_devices_cannot_take_is_refused(spec, fragment):
  with pytest.raises(ValueError) as e:
    mesh_lib.resolve(spec, 8)
  assert fragment in str(e.value)


def test_one_device_mesh_is_the_default_and_a_bigger_one_is_refused_before_writing(tmp_path):
  from train import trainer  # pylint: disable=g-import-not-at-top

  mesh = mesh_lib.create()
  assert mesh.axis_names == ('data', 'fsdp', 'sequence') and mesh.devices.size == 1
  config = main_runner.config()
  config.train.mesh.fsdp = 2
  with pytest.raises(
    validate.ConfigError, match=r'does not fit 1 device: the fixed axes \(2 devices\)'
  ):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_the_fsdp_rule_splits_the_largest_divisible_axis_of_large_leaves():
  assert mesh_lib.fsdp_axis((64, 128), 2, 1024) == 1
  assert mesh_lib.fsdp_axis((128, 64), 2, 1024) == 0
  assert mesh_lib.fsdp_axis((64, 4, 16), 2, 1024) == 0
  assert mesh_lib.fsdp_axis((6, 64, 5), 4, 1024) == 1  # 6 and 5: not divisible by 4
  assert mesh_lib.fsdp_axis((64, 64), 2, 1024) == 0  # the first of equals
  assert mesh_lib.fsdp_axis((3, 5, 7), 2, 0) is None  # none divisible
  assert mesh_lib.fsdp_axis((64,), 2, 1024) is None  # under the floor: replicated
  assert mesh_lib.fsdp_axis((), 2, 0) is None  # a scalar (Adam's count)
  assert mesh_lib.fsdp_axis((64, 128), 1, 0) is None  # fsdp 1


def test_batch_and_length_refusals_name_the_value_and_the_valid_ones():
  class Mesh:  # what the checks read of a mesh
    axis_names = ('data', 'fsdp', 'sequence')
    shape = {'data': 4, 'fsdp': 2, 'sequence': 2}

  with pytest.raises(ValueError) as e:
    mesh_lib.check_batch(Mesh, 12)
  assert str(e.value) == (
    'config.dataset.batch_size=12 must be divisible by the number of '
    'devices its rows are split over, 8 (data 4 x fsdp 2: config.train.'
    'mesh); valid: multiples of 8'
  )
  mesh_lib.check_batch(Mesh, 16)
  with pytest.raises(ValueError) as e:
    mesh_lib.check_length(Mesh, 17, "config.model.kind='causal' on 'mqar'")
  assert str(e.value) == (
    "sequence length 17 (config.model.kind='causal' on 'mqar') is not "
    "divisible by config.train.mesh['sequence']=2; valid: lengths that "
    "are multiples of 2, or a sequence size dividing 17"
  )
  mesh_lib.check_length(Mesh, 16, '')


# ----------------------------------------------------------------------------
# 8 CPU devices, in a subprocess.
# ----------------------------------------------------------------------------

# argv: root folder, the mesh (JSON), the config argument of configs/mqar.py.
SCRIPT = r'''
import json, os, shutil, sys
import jax, numpy as np
import data
from jax.sharding import PartitionSpec as P
from configs import mqar
from train import api, inference, trainer, validate
assert jax.device_count() == 8, jax.devices()
root, MESH, ARG = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]

def config(mesh, arg=ARG, **train):
  c = mqar.get_config(arg)
  c.dataset.data_dir = os.path.join(root, 'data')
  c.dataset.sizes.validation = c.dataset.sizes.test = 64
  c.dataset.update(dict(batch_size=16, eval_batch_size=32))
  c.model.update(dict(depth=1, dropout_rate=0.1))  # dropout: the masks must not depend on devices
  c.optim.update(dict(name='sgd', learning_rate=0.5, warmup_steps=0))
  c.train.update(dict(num_steps=4, log_every=1, checkpoint_every=2, keep_checkpoints=5,
                      eval_every=-1, fsdp_min_size=256, **train))
  c.train.mesh = mesh
  return c

def refused(c, fragment):
  workdir = os.path.join(root, 'refused')
  try:
    trainer.train_and_evaluate(c, workdir)
    raise AssertionError(f'not refused: {fragment}')
  except validate.ConfigError as e:
    assert fragment in str(e) and '\n' not in str(e), str(e)
  assert not os.path.exists(workdir), 'the workdir was written before the refusal'

# Refusals the devices decide, before anything is written.
c = config(MESH)
c.dataset.batch_size = 10
refused(c, 'config.dataset.batch_size=10 must be divisible by the number of devices its rows '
           'are split over, 4 (data 2 x fsdp 2: config.train.mesh); valid: multiples of 4')
refused(config({'data': 1, 'sequence': 8}, ARG.replace('seq_len=16', 'seq_len=12')),
        "sequence length 12 (config.model.kind='causal' on 'mqar') is not divisible by "
        "config.train.mesh['sequence']=8")
refused(config(MESH, ARG.replace('softmax', 'reformer')),
        "config.train.mesh['sequence']=2 splits the sequence, but mechanism 'reformer' cannot:")
c = config(MESH)
c.model.attention_dropout_rate = 0.1
refused(c, "config.model.attention_dropout_rate=0.1 with config.train.mesh['sequence']=2")

# Parameters and optimiser state sharded over 'fsdp' above the floor, batches over the mesh.
run = api.build(config(MESH), num_steps=4)
params = run.state.params
kernel = params['decoder']['block_0']['mlp']['Dense_0']['kernel']  # [32, 64]
assert kernel.sharding.spec == P(None, 'fsdp'), kernel.sharding
assert kernel.addressable_shards[0].data.shape == (32, 32)
momentum = run.state.opt_state[-1][0].trace['decoder']['block_0']['mlp']['Dense_0']['kernel']
assert momentum.sharding.spec == P(None, 'fsdp'), momentum.sharding
bias = params['decoder']['block_0']['mlp']['Dense_0']['bias']  # 64 < fsdp_min_size
assert bias.sharding.spec == P() and bias.sharding.is_fully_replicated
batch = run.to_devices(next(iter(api.build(config({'data': 1}), devices=jax.devices()[:1])
                                 .train_batches())))
assert batch['inputs'].sharding.spec == P(('data', 'fsdp'), 'sequence'), batch['inputs'].sharding
assert batch['inputs'].addressable_shards[0].data.shape == (4, 8)
assert batch['label'].sharding.spec == P(('data', 'fsdp'),)
# The attention splits the sequence: the ring passes key/value blocks between devices.
assert 'stablehlo.collective_permute' in run.train_step.lower(run.state, batch).as_text()

# One device, the same global batch: the reference.
one = api.build(config({'data': 1}), num_steps=4, devices=jax.devices()[:1])
state, batches, losses = one.state, one.train_batches(), []
for _ in range(4):
  state, metrics = one.train_step(state, next(batches))
  losses.append(float(metrics['loss'] / metrics['count']))
reference = jax.device_get(state.params)

def rows(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r for r in map(json.loads, f) if r['split'] == 'train']

def close(a, b, what):
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-5,
                               err_msg=f'{what}: {jax.tree_util.keystr(path)}')

# The trainer on the mesh: the losses and parameters of the one-device run.
full = os.path.join(root, 'full')
results = trainer.train_and_evaluate(config(MESH), full)
assert results['mesh'] == MESH, results['mesh']
got = [r['loss'] for r in rows(full)]
np.testing.assert_allclose(got, losses, rtol=1e-5, atol=1e-6)
assert losses[-1] < losses[0] - 0.1, losses  # it learned: the comparison is not of idle params
close(reference, inference.load(full)[2], 'mesh run vs one device')

# Evaluation with an eval batch size the mesh's 4 row devices do not divide (25: batches of
# 28 rows, the last 8 examples + 20 padding) equals one unpadded batch on one device, and
# what a padding row holds changes no sum of the mesh's eval step, bit for bit.
c = config(MESH)
c.dataset.eval_batch_size = 25
padded_run = api.build(c)
padded = padded_run.evaluate(reference)
whole = config({'data': 1})
whole.dataset.eval_batch_size = 64
unpadded = api.build(whole, devices=jax.devices()[:1]).evaluate(reference)
assert padded['accuracy'] == unpadded['accuracy'], (padded, unpadded)
np.testing.assert_allclose(padded['loss'], unpadded['loss'], rtol=1e-6)
last = list(data.get_eval_data(c, row_multiple=4).batches())[-1]
assert last['mask'].sum() == 8 and len(last['mask']) == 28, last['mask']
noisy = dict(last, inputs=last['inputs'].copy(), label=last['label'].copy())
rng = np.random.default_rng(0)
noisy['inputs'][8:] = rng.integers(1, 32, size=noisy['inputs'][8:].shape)
noisy['label'][8:, :, 1] = rng.integers(0, 32, size=noisy['label'][8:, :, 1].shape)
sums = [jax.device_get(padded_run.eval_step(reference, padded_run.to_devices(b)))
        for b in (last, noisy)]
for key in sums[0]:
  np.testing.assert_array_equal(sums[1][key], sums[0][key], err_msg=key)

# Saved on the mesh at step 2, resumed on data=8 (parameters replicated): as uninterrupted.
resumed = os.path.join(root, 'resumed')
shutil.copytree(full, resumed)
shutil.rmtree(os.path.join(resumed, 'checkpoints', '4'))
os.remove(os.path.join(resumed, 'results.json'))
again = trainer.train_and_evaluate(config({'data': 8}), resumed)
assert again['resumed_from_step'] == 2 and again['mesh'] == {'data': 8, 'fsdp': 1, 'sequence': 1}
np.testing.assert_allclose([r['loss'] for r in rows(resumed)], got, rtol=1e-5, atol=1e-6)
close(inference.load(full)[2], inference.load(resumed)[2], 'resumed on data=8 vs uninterrupted')
print('OK', losses)
'''


def eight_devices_env():
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env.update(
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=f'{main_runner.XLA_FLAGS} --xla_force_host_platform_device_count=8',
  )
  return env


@pytest.mark.slow
def test_data_fsdp_sequence_mesh_trains_like_one_device_and_resumes_on_another(tmp_path):
  """The issue's done-when: train.mesh={'data': 2, 'fsdp': 2, 'sequence': 2} trains and
  resumes on 8 CPU devices; its losses (and parameters) are a 1-device run's to round-off."""
  proc = subprocess.run(
    [sys.executable, '-c', SCRIPT, str(tmp_path), json.dumps(MESH), ARG],
    cwd=ROOT,
    env=eight_devices_env(),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert 'OK' in proc.stdout


# ----------------------------------------------------------------------------
# Two processes on loopback, the sequence split across both.
# ----------------------------------------------------------------------------


def overrides(data_dir):
  """main.py's flags for the tiny run of SCRIPT's `config`."""
  return [
    f'--config.dataset.data_dir={data_dir}',
    '--config.dataset.sizes.validation=64',
    '--config.dataset.sizes.test=64',
    '--config.dataset.batch_size=16',
    '--config.dataset.eval_batch_size=32',
    '--config.model.depth=1',
    '--config.model.dropout_rate=0.1',
    '--config.optim.name=sgd',
    '--config.optim.learning_rate=0.5',
    '--config.optim.warmup_steps=0',
    '--config.train.num_steps=4',
    '--config.train.log_every=1',
    '--config.train.checkpoint_every=2',
    '--config.train.eval_every=-1',
    '--config.train.fsdp_min_size=256',
  ]


@pytest.mark.slow
def test_two_processes_split_the_sequence_across_both_like_one_device(tmp_path):
  """2 processes x 2 CPU devices, train.mesh={'data': 1, 'sequence': 4}: every device a
  quarter of each sequence, so the ring passes key/value blocks between the processes,
  and both processes feed the same rows. Losses and parameters: a 1-device run's."""
  from train import inference  # pylint: disable=g-import-not-at-top

  data_dir = str(tmp_path / 'data')
  config = main_runner.parsed_config(f'configs/mqar.py:{ARG}', *overrides(data_dir))
  validate.resolve(config)  # writes the data once, before the processes read it
  base = [
    sys.executable,
    'main.py',
    f'--config=configs/mqar.py:{ARG}',
    '--verbosity=0',
    *overrides(data_dir),
  ]
  address = f'127.0.0.1:{main_runner.free_port()}'
  multi, single = str(tmp_path / 'multi'), str(tmp_path / 'single')
  procs = []
  for i in range(2):
    kwargs = main_runner.popen_kwargs()
    kwargs['env']['XLA_FLAGS'] += ' --xla_force_host_platform_device_count=2'
    procs.append(
      subprocess.Popen(
        base
        + [
          f'--workdir={multi}',
          '--config.train.mesh.data=1',
          '--config.train.mesh.sequence=4',
          f'--coordinator_address={address}',
          '--num_processes=2',
          f'--process_id={i}',
        ],
        **kwargs,
      )
    )
  procs.append(subprocess.Popen(base + [f'--workdir={single}'], **main_runner.popen_kwargs()))
  main_runner.finish(procs, 300)
  with open(os.path.join(multi, 'results.json')) as f:
    results = json.load(f)
  assert results['devices'] == 4 and results['mesh'] == {'data': 1, 'fsdp': 1, 'sequence': 4}
  rows, expected = main_runner.metric_rows(multi), main_runner.metric_rows(single)
  assert [r['step'] for r in rows] == [r['step'] for r in expected] == [1, 2, 3, 4]
  for row, ref in zip(rows, expected):
    assert row['loss'] == pytest.approx(ref['loss'], rel=1e-5, abs=1e-6), row['step']
  assert rows[-1]['loss'] < rows[0]['loss'] - 0.1
  for x, y in zip(
    jax.tree.leaves(inference.load(multi)[2]), jax.tree.leaves(inference.load(single)[2])
  ):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# docs/scaling.md says what the registry and the measurement say.
# ----------------------------------------------------------------------------


def _scaling_doc():
  with open(os.path.join(ROOT, 'docs', 'scaling.md')) as f:
    text = f.read()
  return text[
    text.index('### Which mechanisms split the sequence') : text.index(
      '## Checkpoints do not stall training'
    )
  ]


def test_the_scaling_guide_lists_each_mechanisms_sequence_parallel_form_and_why_not():
  from efficient_attn import registry  # pylint: disable=g-import-not-at-top

  section = _scaling_doc()
  forms = {}
  for form, names in re.findall(
    r'^\| (ring|prefix_state|decayed_state|transition|halo) \| '
    r'([^|]+) \|',
    section,
    re.M,
  ):
    for name in names.split(','):
      forms[name.strip()] = form
  whole = dict(re.findall(r'^\| (\w+) \| (it[s ][^|]+) \|$', section, re.M))
  declared = {m.name: m.sequence_parallel for m in registry.mechanisms()}
  assert forms == {name: form for name, form in declared.items() if form}
  assert whole == {
    m.name: m.whole_sequence for m in registry.mechanisms() if not m.sequence_parallel
  }


def test_the_scaling_guide_shows_the_measured_table_as_written():
  with open(os.path.join(ROOT, 'docs', 'results', 'scale.md')) as f:
    measured = f.read()
  table = measured[measured.index('| mechanism | devices |') :].strip()
  assert table in _scaling_doc()

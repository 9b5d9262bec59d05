"""Data parallelism: one step on 8 (host-platform CPU) devices equals one on 1 device."""

import os
import subprocess
import sys

import main_runner
import pytest

from train import sharding

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs in a fresh process: XLA_FLAGS must be set before jax is imported.
SCRIPT = r'''
import jax, numpy as np
from configs import default
import data
from train import modeling, optim, sharding, steps, tasks
assert jax.device_count() == 8, jax.devices()
config = default.get_config()
config.model.update(dict(depth=1, dropout_rate=0.1))  # dropout: masks must not depend on devices
try:
  sharding.check_batch_size(12, sharding.create_mesh())
  raise AssertionError('12 examples cannot be split over 8 devices')
except ValueError as e:
  assert 'batch_size=12 must be divisible by the number of devices (8)' in str(e), e
task = tasks.get_task(config.task)
model = modeling.create_model(config)
tx = optim.create_optimizer(config, num_steps=100)
batch = next(data.get_train_data(config).batches(7))
eval_batch = data.get_eval_batch(config)
params = steps.init_params(model, config, jax.random.key(0))
results = {}
for n in (1, 8):
  mesh = sharding.create_mesh(jax.devices()[:n])
  state = steps.create_train_state(model, tx, config, mesh, None, params)
  step = steps.make_train_step(task, model, tx, jax.random.key(1), mesh)
  for i in range(3):  # step 0 has learning rate 0 (warmup)
    global_batch = sharding.to_global(batch, mesh)
    assert len(global_batch['inputs'].sharding.device_set) == n
    state, metrics = step(state, global_batch)
  eval_sums = steps.make_eval_step(task, model, mesh)(state.params,
                                                      sharding.to_global(eval_batch, mesh))
  results[n] = jax.device_get((state.params, metrics, eval_sums))
(p1, m1, e1), (p8, m8, e8) = results[1], results[8]
for k in m1:
  np.testing.assert_allclose(m8[k], m1[k], rtol=1e-5, atol=1e-5, err_msg=k)
for k in e1:
  np.testing.assert_allclose(e8[k], e1[k], rtol=1e-5, atol=1e-5, err_msg=k)
for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
  np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
changed = any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                      jax.tree.leaves(p1)))
assert changed
print('OK', float(m1['loss'] / m1['count']), float(m8['loss'] / m8['count']))
'''


@pytest.mark.slow
def test_data_parallel_step_matches_single_device():
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=f'{main_runner.XLA_FLAGS} --xla_force_host_platform_device_count=8',
  )
  proc = subprocess.run(
    [sys.executable, '-c', SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert 'OK' in proc.stdout


def test_initialize_distributed_only_when_asked(monkeypatch):
  for name in sharding._CLUSTER_ENV:  # pylint: disable=protected-access
    monkeypatch.delenv(name, raising=False)
  assert not sharding.initialize_distributed(mode='auto')
  assert not sharding.initialize_distributed(mode='off')
  monkeypatch.setenv('SLURM_NTASKS', '1')
  assert not sharding._multi_process_env()  # pylint: disable=protected-access
  monkeypatch.setenv('SLURM_NTASKS', '4')
  assert sharding._multi_process_env()  # pylint: disable=protected-access
  with pytest.raises(ValueError, match='auto, on, off'):
    sharding.initialize_distributed(mode='maybe')


def test_any_process_single():
  assert sharding.any_process(True) and not sharding.any_process(False)
  assert sharding.is_writer()

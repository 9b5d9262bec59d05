"""Save, stop, resume: identical parameters; corrupt checkpoints; init_from (SIGTERM:
test_interrupt.py)."""

import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default as default_config
from train import adapters
from train import checkpoint
from train import inference
from train import trainer


def short_config(**train):
  config = default_config.get_config()
  config.train.update(
    dict(
      num_epochs=-1,
      num_steps=40,
      checkpoint_every=20,
      keep_checkpoints=5,
      log_every=10,
      eval_every=-1,
    )
  )
  config.train.update(train)
  config.model.update(dict(depth=1, dropout_rate=0.1))  # dropout: the step rngs matter too
  return config


def assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope='module')
def full_run(run_once):
  """40 steps uninterrupted, checkpoints at 20 and 40."""
  workdir = run_once('checkpoint_full', lambda d: trainer.train_and_evaluate(short_config(), d))
  with open(os.path.join(workdir, 'results.json')) as f:
    return workdir, json.load(f)


def test_resume_continues_with_identical_parameters(full_run, tmp_path):
  workdir, results = full_run
  resumed = str(tmp_path / 'resumed')
  shutil.copytree(workdir, resumed)  # as if the run had stopped right after step 20
  shutil.rmtree(os.path.join(resumed, 'checkpoints', '40'))
  os.remove(os.path.join(resumed, 'results.json'))
  # The resumed half saves synchronously (a field a resumed run may change): same run.
  resumed_results = trainer.train_and_evaluate(short_config(async_checkpoints=False), resumed)
  assert resumed_results['resumed_from_step'] == 20 and results['resumed_from_step'] == 0
  assert results['checkpoints_saved'] == 2 and resumed_results['checkpoints_saved'] == 1
  assert results['checkpoint_stall_s'] > 0 and resumed_results['checkpoint_stall_s'] > 0
  _, _, params = inference.load(workdir)
  _, _, resumed_params = inference.load(resumed)
  assert_trees_equal(params, resumed_params)
  assert resumed_results['eval_loss'] == results['eval_loss']


def corrupt(step_dir):
  for root, _, files in os.walk(os.path.join(step_dir, 'params')):
    for name in files:
      with open(os.path.join(root, name), 'wb') as f:
        f.write(b'garbage')


def test_corrupt_latest_checkpoint_falls_back_to_previous(full_run, tmp_path, caplog):
  workdir, _ = full_run
  copy = str(tmp_path / 'copy')
  shutil.copytree(workdir, copy)
  corrupt(os.path.join(copy, 'checkpoints', '40'))
  os.makedirs(os.path.join(copy, 'checkpoints', '60.orbax-checkpoint-tmp'))  # killed mid-save
  with caplog.at_level(logging.WARNING):
    step, params = checkpoint.restore_params(copy)
  assert step == 20
  assert any('step 40' in r.getMessage() and 'damaged' in r.getMessage() for r in caplog.records)
  expected = checkpoint.Checkpointer(workdir, create=False)
  expected_params = expected.manager.restore(20)['params']
  expected.close()
  assert_trees_equal(params, expected_params)


def test_save_refuses_non_finite_params(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  params = {'w': jnp.array([1.0, jnp.nan])}
  with pytest.raises(FloatingPointError, match='step 7'):
    ckpt.save(7, params, {}, force=True)
  ckpt.close()
  assert checkpoint.Checkpointer(str(tmp_path)).steps() == []


def test_a_relative_workdir_saves_and_restores(tmp_path, monkeypatch):
  """`--workdir=runs/default` (the README's command): Orbax needs absolute paths."""
  monkeypatch.chdir(tmp_path)
  params = {'w': jnp.arange(3.0)}
  ckpt = checkpoint.Checkpointer('runs/default')
  assert ckpt.save(5, params, {'m': jnp.zeros(3)}, force=True)
  ckpt.close()
  assert os.path.isdir(tmp_path / 'runs' / 'default' / 'checkpoints')
  step, restored = checkpoint.restore_params('runs/default')
  assert step == 5
  assert_trees_equal(restored, params)


def test_init_from_copies_matching_leaves():
  fresh = {'a': np.zeros(3), 'head': {'kernel': np.zeros((4, 5))}, 'lora': np.zeros(2)}
  loaded = {'a': np.ones(3), 'head': {'kernel': np.ones((4, 10))}, 'old': np.ones(1)}
  params, report = adapters.init_from(short_config(), fresh, loaded)
  np.testing.assert_array_equal(params['a'], np.ones(3))
  np.testing.assert_array_equal(params['head']['kernel'], np.zeros((4, 5)))
  assert report['copied'] == ['a'] and sorted(report['fresh']) == ['head/kernel', 'lora']
  assert report['unused'] == ['head/kernel', 'old']  # reshaped or gone


def test_init_from_starts_from_the_other_runs_params(full_run, tmp_path):
  workdir, results = full_run
  config = short_config(num_steps=1)
  config.init_from = workdir
  config.optim.learning_rate = 1e-12  # the one step leaves the loaded params as they are
  new = trainer.train_and_evaluate(config, str(tmp_path))
  assert new['eval_loss'] == pytest.approx(results['eval_loss'], rel=1e-5)
  assert new['eval_loss'] < 2.0  # a fresh model (zero head) has loss ln(10) = 2.30

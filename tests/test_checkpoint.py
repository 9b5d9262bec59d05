"""Save, stop, resume: identical parameters; corrupt checkpoints; SIGTERM; init_from."""
import json
import logging
import os
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default as default_config
from train import checkpoint
from train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def short_config(**train):
  config = default_config.get_config()
  config.train.update(dict(num_epochs=-1, num_steps=40, checkpoint_every=20, keep_checkpoints=5,
                           log_every=10, eval_every=-1))
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
  resumed_results = trainer.train_and_evaluate(short_config(), resumed)
  assert resumed_results['resumed_from_step'] == 20 and results['resumed_from_step'] == 0
  _, _, params = trainer.load_model_and_params(workdir)
  _, _, resumed_params = trainer.load_model_and_params(resumed)
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
  assert any('step 40' in r.getMessage() and 'unreadable' in r.getMessage()
             for r in caplog.records)
  expected = checkpoint.Checkpointer(workdir, create=False)
  expected_params = expected.manager.restore(20)['params']
  expected.close()
  assert_trees_equal(params, expected_params)


def test_save_refuses_non_finite_params(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  params = {'w': jnp.array([1.0, jnp.nan])}
  with pytest.raises(FloatingPointError, match='step 7'):
    ckpt.save(7, params, {})
  ckpt.close()
  assert checkpoint.Checkpointer(str(tmp_path)).steps() == []


def test_merge_params():
  fresh = {'a': np.zeros(3), 'head': {'kernel': np.zeros((4, 5))}, 'lora': np.zeros(2)}
  loaded = {'a': np.ones(3), 'head': {'kernel': np.ones((4, 10))}, 'old': np.ones(1)}
  params, report = checkpoint.merge_params(fresh, loaded)
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


def test_sigterm_saves_and_exits_cleanly_then_resumes(tmp_path):
  workdir = str(tmp_path / 'run')
  cmd = [sys.executable, 'main.py', '--config=configs/default.py', f'--workdir={workdir}',
         '--config.train.num_epochs=-1', '--config.train.num_steps=1000000',
         '--config.train.log_every=5', '--config.train.checkpoint_every=100000',
         '--config.model.depth=1']

  def run_until_progress_then_sigterm():
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
      for line in proc.stdout:  # progress lines go to stdout
        if line.startswith('step '):
          break
      proc.send_signal(signal.SIGTERM)
      _, stderr = proc.communicate(timeout=120)
    finally:
      if proc.poll() is None:
        proc.kill()
    return proc.returncode, stderr

  rc, stderr = run_until_progress_then_sigterm()
  assert rc == 0, stderr[-3000:]
  assert 'Stopped by SIGTERM at step' in stderr, stderr[-3000:]
  first = int(stderr.split('Stopped by SIGTERM at step ')[1].split('/')[0])
  assert checkpoint.Checkpointer(workdir, create=False).steps() == [first]
  rc, stderr = run_until_progress_then_sigterm()
  assert rc == 0, stderr[-3000:]
  assert f'Resumed from the checkpoint at step {first}' in stderr
  second = int(stderr.split('Stopped by SIGTERM at step ')[1].split('/')[0])
  assert second > first
  assert not os.path.exists(os.path.join(workdir, 'results.json'))

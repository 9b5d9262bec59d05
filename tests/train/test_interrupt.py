"""Interruptions: SIGKILL and SIGTERM mid-run, corrupt checkpoints, a diverging loss.

Each interrupted run is re-run with the same command and must end with the
parameters of an uninterrupted run (data order and rngs are functions of the
step). Real processes where a signal is involved, the trainer in-process
elsewhere.
"""

import json
import logging
import os
import shutil
import signal
import subprocess
import time

import jax
import main_runner
import numpy as np
import pytest

from train import checkpoint
from train import inference
from train import trainer

STEPS, EVERY = 16, 2  # checkpoints at 2, 4, ..., 16 (all kept)
SLOW_STEP_S = 0.2  # per training batch, so that the signals land mid-run
TIMEOUT_S = 180


def params_of(workdir):
  return inference.load(workdir)[2]


def assert_same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def results_of(workdir):
  with open(os.path.join(workdir, 'results.json')) as f:
    return json.load(f)


@pytest.fixture(scope='module')
def reference(run_once):
  """(workdir, final params) of the uninterrupted run, trained once per session (run_once)."""
  workdir = run_once(
    'interrupt_reference',
    lambda workdir: trainer.train_and_evaluate(
      main_runner.config(num_steps=STEPS, checkpoint_every=EVERY), workdir
    ),
  )
  return workdir, params_of(workdir)


def wait_for(condition, proc, what):
  deadline = time.time() + TIMEOUT_S
  while not condition():
    assert proc.poll() is None, f'the run ended (rc={proc.returncode}) before {what}'
    assert time.time() < deadline, f'timed out waiting for {what}'
    time.sleep(0.05)


def rerun(workdir, checkpoint_every=EVERY):
  """Runs the command again (at full speed) to the end; returns its log."""
  cmd = main_runner.command(workdir, num_steps=STEPS, checkpoint_every=checkpoint_every)
  proc = subprocess.run(cmd, timeout=TIMEOUT_S, **main_runner.popen_kwargs())
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc.stderr


def start_slow(workdir, tmp_path, checkpoint_every=EVERY):
  cmd = main_runner.command(workdir, slow=True, num_steps=STEPS, checkpoint_every=checkpoint_every)
  return main_runner.start_logged(cmd, str(tmp_path / 'first.log'), SLOW_STEP_S)


@pytest.mark.slow
def test_sigterm_saves_the_current_step_then_sigkill_resumes_from_the_last_checkpoint(
  reference, tmp_path
):
  """One run interrupted twice, then finished by the same command (three processes):

  1. SIGTERM, with no periodic checkpoints (checkpoint_every=100): the current step is
     saved, the run exits 0 without a traceback and without results.json.
  2. The command again (checkpoint_every may change on a resume) resumes from that step and
     is killed (SIGKILL) after two more checkpoints.
  3. The command again resumes from the last complete checkpoint and ends with the
     parameters and eval loss of the uninterrupted run.
  """
  workdir = str(tmp_path / 'run')
  proc = start_slow(workdir, tmp_path, checkpoint_every=100)  # only SIGTERM saves
  try:
    wait_for(
      lambda: (
        os.path.exists(os.path.join(workdir, 'metrics.jsonl'))
        and any(r['step'] >= 4 for r in main_runner.metric_rows(workdir))
      ),
      proc,
      'step 4',
    )
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=TIMEOUT_S)
  finally:
    if proc.poll() is None:
      proc.kill()
  with open(tmp_path / 'first.log') as f:
    log = f.read()
  assert proc.returncode == 0, log[-4000:]
  stopped = int(log.split('Stopped by SIGTERM at step ')[1].split('/')[0])
  assert 4 <= stopped < STEPS
  assert main_runner.committed_steps(workdir) == [stopped]
  assert 'Traceback' not in log
  assert not os.path.exists(os.path.join(workdir, 'results.json'))  # stopped, not finished

  proc = start_slow(workdir, tmp_path)
  try:
    wait_for(
      lambda: len([s for s in main_runner.committed_steps(workdir) if s > stopped]) >= 2,
      proc,
      '2 more checkpoints',
    )
  finally:
    proc.kill()
    proc.wait()
  assert proc.returncode == -signal.SIGKILL
  with open(tmp_path / 'first.log') as f:
    assert f'Resumed from the checkpoint at step {stopped}' in f.read()
  last = main_runner.committed_steps(workdir)[-1]
  assert stopped < last < STEPS and not os.path.exists(os.path.join(workdir, 'results.json'))

  log = rerun(workdir)
  assert f'Resumed from the checkpoint at step {last}' in log
  assert results_of(workdir)['resumed_from_step'] == last
  assert_same_params(params_of(workdir), reference[1])
  assert results_of(workdir)['eval_loss'] == results_of(reference[0])['eval_loss']


def truncate_files(directory):
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)


def delete_array_data(step_dir):
  """Removes the array chunks of `params`, keeping its metadata (a partial copy)."""
  for root, _, files in os.walk(os.path.join(step_dir, 'params')):
    if os.sep + 'd' in root[len(step_dir) :]:
      for name in files:
        os.remove(os.path.join(root, name))


@pytest.mark.slow
def test_corrupt_and_partial_checkpoints_are_skipped_then_replaced(reference, tmp_path, caplog):
  workdir = str(tmp_path / 'run')
  shutil.copytree(reference[0], workdir)
  os.remove(os.path.join(workdir, 'results.json'))
  steps_dir = os.path.join(workdir, 'checkpoints')
  os.rename(os.path.join(steps_dir, '14'), os.path.join(steps_dir, '14.orbax-checkpoint-tmp-1'))
  truncate_files(os.path.join(steps_dir, '16'))  # a truncated copy
  shutil.rmtree(os.path.join(steps_dir, '12', 'opt_state'))  # an item missing
  delete_array_data(os.path.join(steps_dir, '10'))  # metadata without data
  with caplog.at_level(logging.WARNING):
    results = trainer.train_and_evaluate(
      main_runner.config(num_steps=STEPS, checkpoint_every=EVERY), workdir
    )
  assert results['resumed_from_step'] == 8
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  for step in (16, 12, 10):
    assert any(f'step {step} ' in w and 'damaged' in w for w in warnings), (step, warnings)
  step, params = checkpoint.restore_params(workdir)  # 16 was written again, readable
  assert step == STEPS
  assert_same_params(params, reference[1])


@pytest.mark.slow
def test_non_finite_loss_exits_naming_the_step_and_keeps_good_checkpoints(tmp_path):
  workdir = str(tmp_path / 'run')
  cmd = main_runner.command(
    workdir,
    '--config.optim.learning_rate=1e12',
    '--config.optim.warmup_steps=10',
    '--config.optim.grad_clip=0',
    num_steps=20,
    checkpoint_every=1,
    keep_checkpoints=100,
  )
  proc = subprocess.run(cmd, timeout=TIMEOUT_S, **main_runner.popen_kwargs())
  assert proc.returncode != 0
  message = proc.stderr.strip().splitlines()[-1]
  assert message.startswith('Error: non-finite training loss'), proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  bad_step = int(message.split('at step ')[1].split(';')[0])
  saved = main_runner.committed_steps(workdir)
  assert saved and saved[-1] <= bad_step, (saved, bad_step)
  ckpt = checkpoint.Checkpointer(workdir, create=False)
  try:
    for step in saved:  # every checkpoint on disk is readable and finite
      assert checkpoint.all_finite(ckpt.manager.restore(step)['params']), step
  finally:
    ckpt.close()
  assert not os.path.exists(os.path.join(workdir, 'results.json'))

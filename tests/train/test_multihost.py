"""Two processes on loopback (jax.distributed, gloo CPU collectives) = one process.

Process p feeds rows [8p, 8p + 8) of each global batch of 16; the losses, the
final parameters and a resume across both processes must match a
single-process run of the same global batch. The resume shards the state over the two
processes (FSDP), so the checkpoint is restored onto another mesh and saved split. The
resumed pair is set up from the environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID) instead of flags. CPU collectives need no setting: jax 0.10's default
`jax_cpu_collectives_implementation` is 'gloo'.
"""

import glob
import json
import os
import re
import shutil
import subprocess

import jax
import main_runner
import numpy as np
import pytest

from train import inference

TIMEOUT_S = 240  # per run, on 2 busy cores; an idle machine needs about 30 s


def start_pair(workdir, *extra, via_env=False):
  """Starts processes 0 and 1 of one run (jax.distributed settings in flags or env), with
  `extra` flags."""
  address = f'127.0.0.1:{main_runner.free_port()}'
  procs = []
  for i in range(2):
    kwargs = main_runner.popen_kwargs()
    if via_env:
      kwargs['env'].update(
        JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES='2', JAX_PROCESS_ID=str(i)
      )
      cmd = main_runner.command(workdir, *extra)
    else:
      cmd = main_runner.command(
        workdir,
        f'--coordinator_address={address}',
        '--num_processes=2',
        f'--process_id={i}',
        *extra,
      )
    procs.append(subprocess.Popen(cmd, **kwargs))
  return procs


def finish(procs):
  return main_runner.finish(procs, TIMEOUT_S)


def run_pair_and_single(root):
  """Trains the pair and a single process side by side (8 steps, checkpoints at 4, 8).

  Returns the two workdirs and the (stdout, stderr) of processes 0 and 1.
  """
  multi, single = str(root / 'multi'), str(root / 'single')
  procs = start_pair(multi)
  procs.append(subprocess.Popen(main_runner.command(single), **main_runner.popen_kwargs()))
  outputs = finish(procs)
  return multi, single, outputs[:2]


def check_same_losses(multi, single):
  rows, expected = main_runner.metric_rows(multi), main_runner.metric_rows(single)
  assert [r['step'] for r in rows] == [r['step'] for r in expected] == [2, 4, 6, 8]
  for row, ref in zip(rows, expected):
    for key in ('loss', 'accuracy', 'grad_norm'):
      assert row[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), (row['step'], key)
  (eval_row,) = main_runner.metric_rows(multi, 'eval')
  assert eval_row['loss'] == pytest.approx(
    main_runner.metric_rows(single, 'eval')[0]['loss'], rel=1e-5
  )


def check_restores_in_one_process(multi, single):
  _, _, params = inference.load(multi)
  _, _, expected = inference.load(single)
  # Adam divides by sqrt(v): near-zero gradients summed in another order move a
  # parameter by up to ~lr (3e-4 here) differently; the losses agree to 1e-5.
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-4)


def check_only_process_0_writes(multi, outputs):
  events = glob.glob(os.path.join(multi, 'tensorboard', 'events.out.tfevents.*'))
  assert len(events) == 1, events
  from tensorflow.compat.v1 import train as tf_train  # pylint: disable=g-import-not-at-top

  logged = [
    e.step
    for e in tf_train.summary_iterator(events[0])
    for v in e.summary.value
    if v.tag == 'train/loss'
  ]
  assert logged == [2, 4, 6, 8]  # one writer
  steps = [r['step'] for r in main_runner.metric_rows(multi)]
  assert steps == sorted(set(steps))  # one row per step: nobody else appended
  assert sorted(os.listdir(multi)) == [
    'checkpoints',
    'config.json',
    'metrics.jsonl',
    'results.json',
    'tensorboard',
  ]
  (_, stderr0), (_, stderr1) = outputs
  assert re.search(r'\[8\] .*train/loss=', stderr0) and '[8] eval/accuracy=' in stderr0
  assert '[8] eval/accuracy=' in stderr1  # every process logs; only process 0 writes files


# The resumed pair shards the state over both processes (FSDP; every leaf of 64 elements
# or more split): the data-parallel checkpoint is restored onto another mesh, and the new
# step-8 checkpoint is written split over them.
FSDP = (
  '--config.train.mesh.data=1',
  '--config.train.mesh.fsdp=-1',
  '--config.train.fsdp_min_size=64',
)


def split_leaves(workdir) -> int:
  """How many parameter leaves the step-8 checkpoint stored split over the 'fsdp' axis."""
  with open(os.path.join(workdir, 'checkpoints', '8', 'params', '_sharding')) as f:
    leaves = [json.loads(v) for v in json.load(f).values()]
  return sum('fsdp' in json.dumps(leaf['partition_spec']) for leaf in leaves)


def check_resume_from_the_environment_under_fsdp(multi, resumed):
  shutil.copytree(multi, resumed)  # as if both processes had stopped after step 4
  shutil.rmtree(os.path.join(resumed, 'checkpoints', '8'))
  os.remove(os.path.join(resumed, 'results.json'))
  outputs = finish(start_pair(resumed, *FSDP, via_env=True))
  assert 'Resumed from the checkpoint at step 4' in outputs[0][1]
  assert 'Resumed from the checkpoint at step 4' in outputs[1][1]
  rows = main_runner.metric_rows(resumed)
  assert [r['step'] for r in rows] == [2, 4, 6, 8]  # rows past the resumed step rewritten
  for row, ref in zip(rows[2:], main_runner.metric_rows(multi)[2:]):
    assert row['loss'] == pytest.approx(ref['loss'], rel=1e-5), row['step']
  with open(os.path.join(resumed, 'results.json')) as f:
    assert json.load(f)['resumed_from_step'] == 4
  # Orbax records each saved leaf's sharding: split over 'fsdp' now, replicated before.
  assert split_leaves(resumed) > 0 and split_leaves(multi) == 0
  check_restores_in_one_process(resumed, multi)  # the sharded checkpoint, in one process


@pytest.mark.slow
def test_two_processes_train_like_one_and_resume(tmp_path):
  """One test, not four sharing a fixture: pytest-xdist would run the fixture per worker."""
  multi, single, outputs = run_pair_and_single(tmp_path)
  check_same_losses(multi, single)
  check_restores_in_one_process(multi, single)
  check_only_process_0_writes(multi, outputs)
  check_resume_from_the_environment_under_fsdp(multi, str(tmp_path / 'resumed'))

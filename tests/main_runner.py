"""Helpers for tests that run `main.py` in real processes (signals, multi-host).

    cmd = main_runner.command(workdir, num_steps=8, checkpoint_every=4)
    proc = subprocess.run(cmd, **main_runner.popen_kwargs(), timeout=300)

`command` trains a tiny digits ViT (the default config with depth 1, a global
batch of 16 and dropout, so the per-step rngs matter). Each process gets one
CPU device and compiles under `XLA_FLAGS`, as the test processes do.
"""

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The XLA flags of every test process (conftest.py puts them in the environment of the
# pytest processes; `popen_kwargs` gives them to the runs they start). The tests' shapes
# are tiny, so XLA's CPU compiler, not the arithmetic, takes most of the suite's time;
# these flags make it compile about 5-10x faster: no LLVM optimisation, the older (and
# cheaper to compile) loop emitters in place of the MLIR fusion emitters, one codegen
# thread. The results are the same up to float rounding; a test that compares two
# programs bit for bit compiles both under these flags (a run and its resumption, an
# in-process run and a subprocess), so they must be the same in every test process.
XLA_FLAGS = (
  '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true '
  '--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1'
)


def share_compilation_cache() -> None:
  """One JAX compilation cache for the processes the tests start, per pytest session.

  Dozens of them (main.py runs, the 8-device scripts) compile the same small programs:
  the first writes each one, the others read it, and the folder goes with the session.
  A test process compiles each of its programs once, so it neither reads nor writes the
  folder (a cache would only add the writes). xdist workers inherit the controller's folder
  through the environment.
  """
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update('jax_enable_compilation_cache', False)  # this process only
  if 'JAX_COMPILATION_CACHE_DIR' in os.environ:
    return  # the controller's, or the caller's own
  folder = tempfile.mkdtemp(prefix='jax_compilation_cache_')
  os.environ.update(
    JAX_COMPILATION_CACHE_DIR=folder,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0',
  )
  atexit.register(shutil.rmtree, folder, True)


# Wraps main.py so that every training batch arrives `SLOW_STEP_S` seconds
# late: the numbers are unchanged, the run just lasts long enough to be
# interrupted at a chosen point.
SLOW_MAIN = r'''
import os, runpy, sys, time
from data import memory
delay = float(os.environ['SLOW_STEP_S'])
original = memory.TrainData.batches
def batches(self, start_step=0):
  for batch in original(self, start_step):
    time.sleep(delay)
    yield batch
memory.TrainData.batches = batches
sys.argv[0] = 'main.py'
runpy.run_path('main.py', run_name='__main__')
'''


TINY = {'model.depth': 1, 'model.dropout_rate': 0.1, 'dataset.batch_size': 16}
TRAIN = dict(
  num_epochs=-1, num_steps=8, log_every=2, checkpoint_every=4, keep_checkpoints=10, eval_every=-1
)


def settings(**train):
  """{config path: value} of the tiny run; `train` sets config.train fields."""
  return {**TINY, **{f'train.{k}': v for k, v in {**TRAIN, **train}.items()}}


def overrides(**train):
  """The tiny run's settings as --config.* flags."""
  return [f'--config.{k}={v}' for k, v in settings(**train).items()]


def config(**train):
  """The tiny run's config, for running it in this process."""
  from configs import default  # pylint: disable=g-import-not-at-top

  result = default.get_config()
  for path, value in settings(**train).items():
    group, name = path.split('.')
    result[group][name] = value
  return result


def command(workdir, *extra, slow: bool = False, **train):
  """The main.py command line (python -c SLOW_MAIN ... when `slow`), with --verbosity=0:
  the tests read absl's INFO lines (the metric lines, 'Resumed from ...')."""
  prefix = [sys.executable, '-c', SLOW_MAIN] if slow else [sys.executable, 'main.py']
  return prefix + [
    '--config=configs/default.py',
    f'--workdir={workdir}',
    '--verbosity=0',
    *overrides(**train),
    *extra,
  ]


def popen_kwargs(slow_step_s: float = 0.0):
  """cwd, env (1 CPU device, the tests' `XLA_FLAGS` only) and text output for Popen/run."""
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env.update(JAX_PLATFORMS='cpu', SLOW_STEP_S=str(slow_step_s), XLA_FLAGS=XLA_FLAGS)
  return dict(cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def start_logged(cmd, log_path, slow_step_s: float = 0.0) -> subprocess.Popen:
  """Popen with stdout and stderr going to `log_path` (no pipe to drain)."""
  kwargs = popen_kwargs(slow_step_s)
  with open(log_path, 'w') as log:
    kwargs.update(stdout=log, stderr=subprocess.STDOUT)
    return subprocess.Popen(cmd, **kwargs)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def finish(procs, timeout: float):
  """Waits for every process (killing the rest past `timeout` seconds each); fails with the
  stderr of the ones that failed. Returns each one's (stdout, stderr)."""
  outputs = []
  try:
    for proc in procs:
      outputs.append(proc.communicate(timeout=timeout))
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  for proc, (_, stderr) in zip(procs, outputs):
    assert proc.returncode == 0, stderr[-4000:]
  return outputs


def metric_rows(workdir, split='train'):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f if line.endswith('\n')]  # complete lines
  return [row for row in rows if row['split'] == split]


def committed_steps(workdir):
  """Checkpoint steps Orbax has finished writing (tmp directories excluded)."""
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    return []
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def snapshot(folder):
  """{relative path: bytes} of every file under `folder` (what must not change)."""
  out = {}
  for base, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(base, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, folder)] = f.read()
  return out


def parsed_config(config: str, *args):
  """The config main.py builds from `--config=<config> *args` (cli.parse_flags), with
  `config` a path and argument such as 'configs/mqar.py:softmax' under the repository."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  from train import cli  # pylint: disable=g-import-not-at-top

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  argv = ['main.py', f'--config={root}/{config}', *args]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=fv, sys_argv=argv)
  cli.parse_flags(argv, fv)
  return fv.config

"""studies/recall/gpu/run.sh: the recall grid's runner for one GPU (here on the CPU)."""

import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, 'studies', 'recall', 'gpu', 'run.sh')


def _run(tmp_path, *runs, **env):
  env = dict(
    os.environ,
    ROOT=str(tmp_path / 'root'),
    OUT=str(tmp_path / 'out'),
    CUDA_VISIBLE_DEVICES='',
    **env,
  )
  return subprocess.run(
    ['bash', SCRIPT, *runs], capture_output=True, text=True, env=env, check=False, timeout=600
  )


@pytest.mark.parametrize(
  'run',
  [
    '0:softmax:128',
    'a:softmax:128:256x16',
    '0:softmax:128:256',
    '0:Soft-max:128:256x16',
    '0:linear+:64:128x8',
    '0:linear:64:128x8:window',
  ],
)
def test_a_bad_run_is_one_line_naming_it_before_anything_starts(tmp_path, run):
  out = _run(tmp_path, '0:linear:64:128x8', run)
  assert out.returncode == 2
  assert f"run '{run}' is not valid; write seed:mechanism:width:cell" in out.stderr
  assert not (tmp_path / 'root').exists()


@pytest.mark.parametrize('level', ['5', 'off', '-1'])
def test_a_bad_autotune_level_is_one_line_naming_it_before_anything_starts(tmp_path, level):
  out = _run(tmp_path, '0:linear:64:128x8', AUTOTUNE=level)
  assert out.returncode == 2
  assert f"AUTOTUNE='{level}' is not valid; write a level 0-4" in out.stderr
  assert not (tmp_path / 'root').exists()


def test_no_runs_or_no_out_is_a_usage_line(tmp_path):
  assert 'usage:' in _run(tmp_path).stderr
  env = {k: v for k, v in os.environ.items() if k != 'OUT'}
  out = subprocess.run(
    ['bash', SCRIPT, '0:linear:64:128x8'], capture_output=True, text=True, env=env, check=False
  )
  assert out.returncode != 0 and 'set OUT to the folder the results go to' in out.stderr


@pytest.mark.slow
def test_runs_finish_pack_and_a_second_call_finds_them_done(tmp_path):
  """A tiny run (4 steps) end to end: the data written first with its fingerprint, the smoke
  run, the run done and packed under the sweep's own name for it (num_heads off its default
  adds '-h1', the run's own setting feature_map=relu '-relu'); a second call skips the smoke
  run and starts nothing."""
  settings = dict(PYTHON=sys.executable, SWEEP_ARGS=',num_steps=4,num_heads=1')
  runs = ('1:linear:16:16x1:feature_map=relu',)
  first = _run(tmp_path, *runs, **settings)
  log = (tmp_path / 'out' / 'log.txt').read_text()
  assert first.returncode == 0, first.stderr[-2000:] + log[-2000:]
  assert 'sha256 of inputs+labels' in log and 'smoke run: test accuracy' in log
  assert "--xla_gpu_autotune_level=0'" in log  # autotuning off by default, after any flags
  run = 'seed1/linear-d16-l16-kv1-h1-relu'
  assert f'START {run}' in log and f'DONE {run}' in log
  with tarfile.open(tmp_path / 'out' / 'recall_gpu.tgz') as tar:
    names = set(tar.getnames())
  assert {f'./{run}/{f}' for f in ('config.json', 'results.json', 'metrics.jsonl')} <= names
  second = _run(tmp_path, *runs, **settings, AUTOTUNE='')  # '': XLA's default, no flag
  log = (tmp_path / 'out' / 'log.txt').read_text()
  assert 'XLA_FLAGS=' in log and 'autotune' not in log
  assert second.returncode == 0 and 'smoke run: passed earlier' in log
  assert '1 of 1 done, 0 running' in log and 'START' not in log

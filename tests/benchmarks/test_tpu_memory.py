"""benchmarks.tpu_memory: its search, and its command at tiny shapes compiled for TPU by
libtpu on this CPU host (skipped where libtpu does not import: `pip install libtpu`, or
its site-packages folder on PYTHONPATH)."""

import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest

from benchmarks import tpu_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_libtpu = pytest.mark.skipif(
  importlib.util.find_spec('libtpu') is None,
  reason='libtpu is not installed: the TPU compiler runs from its wheel (pip install libtpu)',
)


def test_the_search_keeps_the_longest_length_that_fits_and_why_the_next_does_not(monkeypatch):
  """Fake compiles: 1 GiB per 1K tokens on one chip; 32K does not compile."""

  def compile_step(spec, length, chips, devices, fv):
    if length >= 32768:
      return dict(error='XlaRuntimeError: RESOURCE_EXHAUSTED: scoped vmem')
    return dict(bytes=length / 1024 / chips * 2**30, kernel=False)

  monkeypatch.setattr(tpu_memory, 'compile_step', compile_step)
  fv = types.SimpleNamespace(chip_gib=16.0, max_length=2**20)
  one = tpu_memory.longest('linear', 1, 1024, None, fv, lambda line: None)
  assert one['longest']['length'] == 16384 and one['next']['length'] == 32768
  assert [r['length'] for r in one['tried']] == [1024, 2048, 4096, 8192, 16384, 32768]
  eight = tpu_memory.longest('linear', 8, 16384, None, fv, lambda line: None)
  assert eight['longest']['length'] == 16384 and 'scoped vmem' in eight['next']['error']
  fv.max_length = 4096
  capped = tpu_memory.longest('linear', 1, 1024, None, fv, lambda line: None)
  assert capped['longest']['length'] == 4096 and capped['next'] is None
  fv.chip_gib = 0.5
  none = tpu_memory.longest('linear', 1, 1024, None, fv, lambda line: None)
  assert none['longest'] is None and none['next']['length'] == 1024
  assert '| linear | 1 | none |' in tpu_memory.table([none])


def run_tool(*args):
  """The tool in a process of its own, without the tests' XLA_FLAGS: libtpu reads them
  too, and stops at the CPU compiler's (main_runner.XLA_FLAGS)."""
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env.update(JAX_PLATFORMS='cpu')
  return subprocess.run(
    [sys.executable, '-m', 'benchmarks.tpu_memory', *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


@needs_libtpu
@pytest.mark.slow
def test_tiny_run_compiles_the_train_step_for_tpu_chips(tmp_path):
  """linear at 64 and 128 tokens on 1 chip, 128 on 2 (the sequence split over them), and
  the FSDP rule's parameters per chip of 8."""
  proc = run_tool('--tiny', f'--out={tmp_path}', '--name=tpu', '--quiet')
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(tmp_path / 'tpu.json') as f:
    data = json.load(f)
  one, two = data['rows']
  assert (one['chips'], two['chips']) == (1, 2)
  assert [r['length'] for r in one['tried']] == [64, 128]
  assert [r['length'] for r in two['tried']] == [128]
  for row in (one, two):  # at these sizes the compiler's tiles, not the tokens, set it
    assert all(0 < r['bytes'] <= data['budget_bytes'] for r in row['tried'])
    assert row['longest']['length'] == 128 and row['next'] is None  # past --max_length
  fsdp = data['fsdp']
  assert fsdp['chips'] == 8 and fsdp['fsdp']['params'] < fsdp['data']['params'] / 2
  with open(tmp_path / 'tpu.md') as f:
    report = f.read()
  assert 'Compiled for: v5e:2x4' in report and 'Compiler estimates, not measurements' in report
  assert 'Measured on' not in report
  assert 'python -m benchmarks.tpu_memory --tiny' in report


def test_an_unknown_topology_stops_in_one_line_before_any_work(tmp_path):
  proc = run_tool('--topology=v5e:9x9', f'--out={tmp_path}')
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith("Error: --topology='v5e:9x9'")
  assert not os.listdir(tmp_path)

"""benchmarks.scale: the longest sequence per device count at one per-device memory."""

import json
import os
import subprocess
import sys

import main_runner
import pytest

from benchmarks import scale_communication

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HLO = '''HloModule jit_step, num_partitions=4

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %cp = f32[8,16]{1,0} collective-permute(f32[8,16]{1,0} %x), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3}}
  ROOT %t = (s32[], f32[8,16]{1,0}) tuple(%i, %cp)
}

%cond (p: (s32[], f32[8,16])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[8,16], g: f32[100]) -> (f32[8,16], f32[100], bf16[4,10]) {
  %w = (s32[], f32[8,16]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %ar = (f32[100]{0}, f32[20]{0}) all-reduce(f32[100]{0} %g, f32[20]{0} %h), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %ag = bf16[4,10]{1,0} all-gather(bf16[2,10]{1,0} %b), channel_id=3, replica_groups=[2,2]<=[4], dimensions={0}
  ROOT %r = (f32[8,16]{1,0}, f32[100]{0}, bf16[4,10]{1,0}) tuple(%x, %ar, %ag)
}
'''


def test_communication_counts_each_collective_by_its_shapes_groups_and_loops():
  sent = scale_communication.communication(HLO, 4)
  # 3 of 4 devices send 8x16 float32 in each of 5 iterations.
  assert sent['permute'] == pytest.approx(5 * 8 * 16 * 4 * 3 / 4)
  # A ring all-reduce over 4 devices sends 2 (4 - 1) / 4 of the (combined) bytes.
  assert sent['all_reduce'] == pytest.approx(2 * 3 / 4 * (100 + 20) * 4)
  # All-gather in groups of 2: each device sends half the gathered bfloat16 result.
  assert sent['other'] == pytest.approx(1 / 2 * 4 * 10 * 2)
  assert sent['total'] == pytest.approx(sent['permute'] + sent['all_reduce'] + sent['other'])


def two_devices_env():
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env.update(
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=f'{main_runner.XLA_FLAGS} --xla_force_host_platform_device_count=2',
  )
  return env


def run_tool(*args):
  return subprocess.run(
    [sys.executable, '-m', 'benchmarks.scale', *args],
    cwd=ROOT,
    env=two_devices_env(),
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.mark.slow
def test_tiny_run_finds_the_longest_length_per_device_count_within_the_budget(tmp_path):
  proc = run_tool('--tiny', '--mechanisms=linear', f'--out={tmp_path}', '--name=scale', '--quiet')
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(tmp_path / 'scale.json') as f:
    data = json.load(f)
  budget = data['budget_bytes']
  one, two = data['rows']
  assert (one['devices'], two['devices']) == (1, 2)
  for row in (one, two):
    assert row['mechanism'] == 'linear' and row['length'] % (row['devices'] * 32) == 0
    assert row['memory_bytes'] <= budget < row['next_memory_bytes']  # the longest that fits
    assert row['next_length'] == row['length'] + row['devices'] * 32
    assert row['step_s'] > 0
  # Two devices hold twice the sequence: a prefix-state scan costs no memory per token.
  assert two['length'] == 2 * one['length'] and two['vs_one'] == 2.0
  assert one['comm_bytes']['total'] == 0
  assert two['comm_bytes']['all_reduce'] > 0  # the gradients, summed over both devices
  with open(tmp_path / 'scale.md') as f:
    report = f.read()
  assert (
    'command: XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m '
    'benchmarks.scale --tiny --mechanisms=linear'
  ) in report
  assert '| linear | 2 |' in report


def test_bad_flags_stop_in_one_line_before_any_work(tmp_path):
  for args, message in [
    (
      ['--devices=1,4'],
      'Error: --devices=1,4 is not valid with 2 device(s); valid: counts from 1 to 2',
    ),
    (
      ['--mechanisms=nystrom', '--devices=1,2'],
      "Error: --mechanisms: 'nystrom' has no sequence-parallel form; valid: softmax",
    ),
  ]:
    proc = run_tool(*args, f'--out={tmp_path}')
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith('Error: ')
  assert not os.listdir(tmp_path)

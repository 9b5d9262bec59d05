"""benchmarks.flash_precision: one tiny run (Pallas kernel interpreted off a GPU) and its flags."""

import json
import os

import pytest

from benchmarks import flash_precision


def test_a_tiny_run_reports_float32_errors_and_times(tmp_path):
  """Off a GPU every implementation is exact to float32 rounding against float64; a block-size
  variant is timed only; cuDNN is left out (GPU, 16-bit dtypes only)."""
  data = flash_precision.main(
    [
      '--length=32',
      '--heads=1',
      '--head_dim=16',
      '--dtypes=float32',
      '--causal=false',
      '--implementations=dense,cudnn,pallas',
      '--time_length=32',
      '--time_batch=1',
      '--repeats=1',
      '--time_precisions=highest',
      '--pallas_blocks=16,16,16,16,16,16',
      f'--out={tmp_path}',
      '--name=p',
      '--quiet',
    ]
  )
  checked = [r for r in data['records'] if not r.get('timing_only')]
  assert [(r['implementation'], r['precision']) for r in checked] == [
    ('dense', 'default'),
    ('dense', 'highest'),
    ('pallas', 'default'),
    ('pallas', 'highest'),
  ]
  for r in checked:
    assert r['out_error'] < 1e-6 and r['grad_error'] < 1e-6, r
    assert ('time_s' in r) == (r['precision'] == 'highest'), r
  [blocks] = [r for r in data['records'] if r.get('timing_only')]
  assert blocks['blocks'] == [16] * 6 and blocks['time_s'] > 0
  text = open(os.path.join(tmp_path, 'p.md')).read()
  assert '| float32 | no | pallas blocks 16,16,16,16,16,16 | default | (timed only) |' in text
  assert json.load(open(os.path.join(tmp_path, 'p.json')))['meta']['length'] == 32


@pytest.mark.parametrize(
  'flag, message',
  [
    ('--implementations=dense,flash', "--implementations: unknown ['flash']"),
    ('--dtypes=float16', "--dtypes: unknown ['float16']"),
    ('--pallas_blocks=64,64', '--pallas_blocks: six integers'),
    ('--time_precisions=high', "--time_precisions: unknown ['high']"),
    ('--causal=maybe', "--causal: unknown ['maybe']"),
  ],
)
def test_a_bad_flag_exits_in_one_line_before_anything_runs(tmp_path, flag, message):
  with pytest.raises(SystemExit, match='^Error: ' + message.replace('[', r'\[')):
    flash_precision.main([flag, f'--out={tmp_path}'])
  assert not os.listdir(tmp_path)

"""benchmarks.speed's command line: --mechanisms as the other tools name it, only the
targets asked for, no empty speedup plot, bad sizes and dtypes refused in one line before
any work, and a run in which every point failed exits non-zero."""

import json
import os

import pytest

from benchmarks import speed

TINY = ['--lengths=8', '--heads=1', '--head_dim=4', '--modes=fwd', '--repeats=1', '--quiet']


def measured(data):
  return [(p['target'], p['length']) for p in data['points']]


def test_mechanisms_names_what_runs(tmp_path):
  """--mechanisms, as the README and the other tools name it, was refused ('Unknown command
  line flag')."""
  data = speed.main([f'--out={tmp_path}', '--mechanisms=exact,linear', *TINY])
  assert measured(data) == [('exact', 8), ('linear', 8)]


def test_targets_adds_no_layer_nobody_asked_for(tmp_path):
  """--targets added the four default linear layers to what was asked for."""
  data = speed.main([f'--out={tmp_path}', '--targets=linear', *TINY])
  assert measured(data) == [('linear', 8)]
  # A layer asked for in --layers is measured; the same list in both flags is one list.
  data = speed.main(
    [
      f'--out={tmp_path}',
      '--mechanisms=linear',
      '--targets=linear',
      '--layers=linear/efficient',
      *TINY,
    ]
  )
  assert measured(data) == [('linear', 8), ('linear/efficient', 8)]


def test_no_speedup_plot_without_exact(tmp_path):
  """Without 'exact' the speedup plot had no line at all; now it is not drawn, an earlier
  run's is removed, and the table says why in one line."""
  (tmp_path / 'speed_speedup.png').write_bytes(b'an earlier run')
  data = speed.main([f'--out={tmp_path}', '--targets=linear', '--layers=', *TINY])
  assert not (tmp_path / 'speed_speedup.png').exists()
  assert [os.path.basename(p) for p in data['plots']] == ['speed_time.png', 'speed_memory.png']
  text = (tmp_path / 'speed.md').read_text()
  assert (
    "- no speedup plot or table (time of exact / time of the target): 'exact' is not "
    'among the targets.' in text
  )


@pytest.mark.parametrize(
  'flags,message',
  [
    (
      ['--lengths=0'],
      "Error: --lengths='0' is not valid: 0 is not a positive integer; "
      'valid: a comma list of positive integers',
    ),
    (['--lengths=8,-8'], "Error: --lengths='8,-8' is not valid: -8 is not a positive"),
    (['--extra_lengths=linear=0'], "Error: --extra_lengths of linear='0' is not valid: 0"),
    (['--heads=0'], 'Error: flag --heads=0: 0 is not a positive integer'),
    (['--batch=0'], 'Error: flag --batch=0: 0 is not a positive integer'),
    (['--head_dim=-4'], 'Error: flag --head_dim=-4: -4 is not a positive integer'),
    (['--repeats=0'], 'Error: flag --repeats=0: 0 is not a positive integer'),
    (
      ['--dtype=float8'],
      'Error: flag --dtype=float8: value should be one of <float32|bfloat16|float16|float64>',
    ),
    (
      ['--mechanisms=softmax'],
      "Error: --mechanisms='softmax' and --targets='linear' name different lists; give one",
    ),
    (
      ['--targets=', '--mechanisms=linear/efficient'],
      "Error: --mechanisms='linear/efficient' is not valid: 'linear/efficient' is a layer",
    ),
  ],
)
def test_bad_input_stops_in_one_line_before_any_work(tmp_path, flags, message):
  """Each timed an empty problem and wrote it as a result (length, heads, batch 0), or
  recorded every point as failed and exited 0 (a negative size, float8)."""
  out = tmp_path / 'out'
  with pytest.raises(SystemExit) as e:
    speed.main(
      [
        f'--out={out}',
        '--targets=linear',
        '--layers=',
        '--lengths=8',
        '--modes=fwd',
        '--repeats=1',
        '--quiet',
        *flags,
      ]
    )
  assert str(e.value).startswith(message) and '\n' not in str(e.value), str(e.value)
  assert not out.exists()


def test_a_run_where_every_point_failed_exits_non_zero(tmp_path):
  """It exited 0. The outputs are still written: they hold the reasons."""
  with pytest.raises(SystemExit) as e:
    speed.main(
      [
        f'--out={tmp_path}',
        '--targets=linformer',
        '--causal',
        '--lengths=8,16',
        '--heads=1',
        '--head_dim=4',
        '--modes=fwd',
        '--repeats=1',
        '--quiet',
      ]
    )
  assert str(e.value) == (
    'Error: no point was measured (1 of 2 failed, the rest skipped); '
    f"the reasons are in {os.path.join(tmp_path, 'speed.md')}"
  )
  points = json.loads((tmp_path / 'speed.json').read_text())['points']
  assert [(p['status'], p['reason']) for p in points] == [
    ('failed', points[0]['reason']),
    ('skipped', 'a shorter length failed'),
  ]
  assert 'no causal form' in points[0]['reason']

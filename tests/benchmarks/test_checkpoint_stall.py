"""benchmarks.checkpoint_stall (one tiny run) and the stall the trainer records."""

import json
import os

import pytest

from benchmarks import checkpoint_stall


@pytest.mark.slow
def test_both_modes_save_and_are_timed(tmp_path):
  row = checkpoint_stall.main(
    [
      '--config=configs/default.py',
      '--config.dataset.batch_size=16',
      '--saves=3',
      '--steps_between=2',
      f'--workdir={tmp_path / "w"}',
      f'--out={tmp_path}',
      '--quiet',
    ]
  )
  assert set(row['modes']) == {'synchronous', 'asynchronous'}
  for mode, r in row['modes'].items():
    assert len(r['stalls_s']) == 3 and r['stall_s'] > 0 and r['examples_per_s'] > 0
    # every write completed (keep=2: the last two steps), in both modes
    steps = sorted(int(n) for n in os.listdir(tmp_path / 'w' / mode / 'checkpoints') if n.isdigit())
    assert steps == [4, 6], (mode, steps)
  saved = json.loads((tmp_path / 'checkpoint_stall.json').read_text())
  assert 'benchmarks.checkpoint_stall' in saved['command']
  assert '| asynchronous |' in (tmp_path / 'checkpoint_stall.md').read_text()
  with pytest.raises(SystemExit, match='already holds step 6; give --workdir an empty'):
    checkpoint_stall.main(
      [
        '--config=configs/default.py',
        '--config.dataset.batch_size=16',
        '--saves=2',
        '--steps_between=3',
        f'--workdir={tmp_path / "w"}',
        f'--out={tmp_path}',
        '--quiet',
      ]
    )  # no save: no stall to time

"""benchmarks.input: the config's train step on real and synthetic batches (one tiny run)."""

import json

import pytest

from benchmarks import input as input_benchmark


@pytest.mark.slow
def test_real_and_synthetic_rates_are_measured_and_written(tmp_path):
  row = input_benchmark.main(
    [
      '--config=configs/default.py',
      '--config.dataset.batch_size=16',
      '--steps=2',
      '--rounds=1',
      f'--out={tmp_path}',
      '--quiet',
    ]
  )
  assert row['real_examples_per_s'] > 0 and row['synthetic_examples_per_s'] > 0
  assert row['ratio'] == row['real_examples_per_s'] / row['synthetic_examples_per_s']
  saved = json.loads((tmp_path / 'input.json').read_text())
  assert saved['row']['dataset'] == 'digits' and 'benchmarks.input' in saved['command']
  assert '| digits |' in (tmp_path / 'input.md').read_text()

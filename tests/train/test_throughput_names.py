"""One name, one quantity: benchmarks.report's 'ex/s' is the trainer's printed 'ex/s' (its
steady rate, results.json `steady_examples_per_sec`); the rate from the median epoch time
(results.json `examples_per_sec`) is not shown under a rate's name. The report printed
the second as 'examples/s', so the trainer's 2,149 ex/s of a run read 3,141 there."""

import json
import os
import re
import shutil

import pytest
import shared_runs  # the default run, shared with test_train.py

from benchmarks import report


def table_cells(text: str):
  """{header: cell} of the first row of the first markdown table in `text`."""
  rows = [l for l in text.splitlines() if l.startswith('|')]
  split = lambda line: [c.strip() for c in line.strip('|').split('|')]
  return dict(zip(split(rows[0]), split(rows[2])))


def write_run(root, name, seed, steady, by_epoch):
  wd = os.path.join(root, name)
  os.makedirs(wd)
  with open(os.path.join(wd, 'config.json'), 'w') as f:
    json.dump(dict(dataset=dict(name='digits'), train=dict(seed=seed)), f)
  with open(os.path.join(wd, 'results.json'), 'w') as f:
    json.dump(
      dict(
        eval_accuracy=0.5,
        steady_examples_per_sec=steady,
        examples_per_sec=by_epoch,
        epoch_time_s=1.0,
      ),
      f,
    )
  return wd


def test_report_names_the_two_rates_apart(tmp_path):
  runs = [
    write_run(str(tmp_path), f's{seed}', seed, steady, 3141.0)
    for seed, steady in ((0, 2149.0), (1, 2151.0))
  ]
  data = report.main(runs + [f'--out={tmp_path / "out"}', '--quiet'])
  text = (tmp_path / 'out' / 'report.md').read_text()
  cells = table_cells(text)
  assert cells['ex/s'] == '2,149' and 'examples/s' not in cells
  assert '3,141' not in text  # the rate by epoch has no column
  (group,) = data['seed_groups']
  assert group['steady_examples_per_sec_mean'] == 2150.0
  assert group['examples_per_sec_mean'] == 3141.0  # kept in the JSON, by its own name
  assert '| ex/s (mean) |' in text and '| 2,150 |' in text


@pytest.mark.slow
def test_report_shows_the_number_the_trainer_printed_last(run_once, tmp_path):
  """The default config's run (README's quick start): its last progress line's ex/s is
  the report's."""
  workdir = run_once('default', shared_runs.train_default)
  with open(f'{workdir}.stdout') as f:
    last = [l for l in f.read().splitlines() if l.startswith('step ')][-1]
  printed = re.search(r'\| (\d+) ex/s \|', last).group(1)
  report.main([workdir, f'--out={tmp_path}', '--quiet'])
  cells = table_cells((tmp_path / 'report.md').read_text())
  assert cells['ex/s'].replace(',', '') == printed, (cells, last)
  # A run still going (no results.json yet) shows the same number, from its metrics.
  running = tmp_path / 'running'
  shutil.copytree(workdir, running)
  os.remove(running / 'results.json')
  report.main([str(running), f'--out={tmp_path / "out"}', '--quiet'])
  cells = table_cells((tmp_path / 'out' / 'report.md').read_text())
  assert cells['ex/s'].replace(',', '') == printed, (cells, last)

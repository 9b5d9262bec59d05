"""A gs:// workdir end to end: train, resume, evaluate, sweep status, report, PNGs.

`fake_gcs` keeps the bucket in a local folder and redirects only the storage
layers (see tests/fake_gcs.py): every piece of our code sees a real gs:// path.
The test runs from an empty current directory and checks that it stays empty:
a gs:// path given to plain `open()` or `os.makedirs` would land there.
"""

import json
import os

import fake_gcs
import main_runner
import numpy as np
import pytest

from benchmarks import report
from train import checkpoint
from train import samples
from train import sweep
from train import trainer

WORKDIR = 'gs://bucket/runs/digits'


@pytest.fixture
def bucket(monkeypatch, tmp_path):
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  with fake_gcs.installed(monkeypatch, tmp_path / 'bucket') as local:
    yield local
  assert not os.listdir(cwd), f'local files for a gs:// workdir: {os.listdir(cwd)}'


@pytest.mark.slow
def test_train_resume_and_evaluate_in_a_bucket(bucket, tmp_path):
  config = main_runner.config(num_steps=4, checkpoint_every=2, log_every=2)
  first = trainer.train_and_evaluate(config, WORKDIR)
  run = bucket(WORKDIR)
  assert first['steps'] == 4
  for name in ('config.json', 'results.json', 'metrics.jsonl'):
    assert (run / name).is_file(), name
  assert list((run / 'tensorboard').glob('events.out.tfevents.*'))
  assert sorted(os.listdir(run / 'checkpoints' / '4')) == [
    '_CHECKPOINT_METADATA',
    'commit_success.txt',
    'opt_state',
    'params',
  ]
  assert not (run / 'trainer.lock').exists()

  (run / 'results.json').unlink()  # as if stopped after the step-4 checkpoint
  config.train.num_steps = 6  # resume from step 4 to 6
  second = trainer.train_and_evaluate(config, WORKDIR)
  assert second['steps'] == 6
  rows = [json.loads(line) for line in (run / 'metrics.jsonl').read_text().splitlines()]
  train_steps = [r['step'] for r in rows if r['split'] == 'train']
  assert train_steps == [2, 4, 6]  # no row repeated or lost over the resume
  assert checkpoint.Checkpointer(WORKDIR, create=False).steps() == [2, 4, 6]

  values = trainer.evaluate(config, WORKDIR)  # what --mode=eval runs
  assert values['accuracy'] == pytest.approx(second['eval_accuracy'])

  name = os.path.basename(WORKDIR)
  state = sweep.status(
    sweep.Run(name=name, config='configs/default.py', overrides={}), os.path.dirname(WORKDIR)
  )
  assert state == 'done'
  table = report.main(['gs://bucket/runs/*', f'--out={tmp_path / "report"}', '--quiet'])
  assert [r['run'] for r in table['runs']] == [name]
  assert table['runs'][0]['eval_accuracy'] == pytest.approx(second['eval_accuracy'])


def test_sample_png_in_a_bucket(bucket):
  path = samples.save_grid(
    'gs://bucket/runs/pixels/samples.png', np.zeros((4, 8, 8), np.uint8), zoom=2
  )
  assert path == 'gs://bucket/runs/pixels/samples.png'
  assert bucket(path).read_bytes().startswith(b'\x89PNG\r\n\x1a\n')


def test_retrieval_files_in_a_bucket(bucket):
  """LRA's AAN files read straight from gs:// (sweeps/lra.py's aan_dir)."""
  from conftest import write_aan_folder  # pylint: disable=g-import-not-at-top

  from data import aan  # pylint: disable=g-import-not-at-top

  write_aan_folder(str(bucket('gs://bucket/lra/tsv_data')))
  splits = aan.read_splits('gs://bucket/lra/tsv_data')
  assert {k: len(v[2]) for k, v in splits.items()} == {'train': 6, 'validation': 4, 'test': 4}
  with pytest.raises(ValueError, match='no such folder'):
    aan.read_splits('gs://bucket/lra/missing')

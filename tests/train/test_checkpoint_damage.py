"""Damaged checkpoints are set aside, never deleted; a run none of whose checkpoints can be
trusted stops in one line (issue 70, item 8).

It used to warn for each step, train again from step 1 without saying so, and, on
reaching the newest damaged step, delete its arrays, intact when only the manifest was
damaged. The steps below a damaged newer one were not saved again (Orbax saves no step at
or below its newest), so the rerun had no sound checkpoint.
"""

import logging
import os
import shutil

from etils import epath
import jax.numpy as jnp
import main_runner
import numpy as np
import pytest

from train import checkpoint
from train import checkpoint_integrity
from train import trainer
from train import workdir as workdir_lib


def _config(**train):
  return main_runner.config(**{'num_steps': 8, 'checkpoint_every': 4, **train})


@pytest.fixture(scope='module')
def finished(run_once):
  """A finished 8-step run (checkpoints 4 and 8): test_reliability.py's, shared."""
  return run_once('reliability_finished', lambda d: trainer.train_and_evaluate(_config(), d))


def _copy(finished, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(finished, workdir)
  os.remove(os.path.join(workdir, 'results.json'))
  return workdir


def _damage_manifest(workdir, step):
  with open(os.path.join(workdir, 'checkpoints', f'{step}.manifest.json'), 'w') as f:
    f.write('{')


def test_a_run_whose_every_checkpoint_is_damaged_stops_in_one_line(finished, tmp_path, caplog):
  """The issue's case: `{` in every manifest. Nothing is trained, moved or deleted."""
  workdir = _copy(finished, tmp_path)
  for step in (4, 8):
    _damage_manifest(workdir, step)
  before = main_runner.snapshot(workdir)
  with pytest.raises(workdir_lib.WorkdirError) as error, caplog.at_level(logging.WARNING):
    trainer.train_and_evaluate(_config(), workdir)
  assert 'checkpoint at step 4' in caplog.records[-1].getMessage()
  assert caplog.records[-1].getMessage().endswith('; no earlier checkpoint')
  message = str(error.value)
  assert '\n' not in message
  assert 'steps 4, 8' in message and '--restart' in message and 'repair' in message
  after = main_runner.snapshot(workdir)
  after.pop(workdir_lib.LOCK, None)
  before.pop(workdir_lib.LOCK, None)
  assert after == before


def test_a_damaged_newest_manifest_sets_its_step_aside_and_saves_it_again(finished, tmp_path):
  """Only step 8's manifest is damaged: the run resumes from step 4; step 8's arrays
  (intact) are moved to damaged_checkpoints/, not deleted; step 6, which Orbax skipped
  while the damaged step 8 was its newest, and step 8 are saved again, sound."""
  workdir = _copy(finished, tmp_path)
  _damage_manifest(workdir, 8)
  step_8 = main_runner.snapshot(os.path.join(workdir, 'checkpoints', '8'))
  results = trainer.train_and_evaluate(_config(checkpoint_every=2), workdir)
  assert results['resumed_from_step'] == 4
  assert main_runner.committed_steps(workdir) == [4, 6, 8]
  aside = os.path.join(workdir, checkpoint.DAMAGED, '8')
  assert main_runner.snapshot(aside) == step_8
  with open(os.path.join(workdir, checkpoint.DAMAGED, '8.manifest.json')) as f:
    assert f.read() == '{'
  for step in (6, 8):
    _, damage = checkpoint_integrity.check_files(checkpoint.checkpoint_dir(workdir), step)
    assert damage is None
  assert checkpoint.restore_params(workdir)[0] == 8


def _toy(step):
  return {'w': jnp.arange(4.0) + step}, {'m': jnp.zeros(2) + step}


def _flip_a_byte(step_dir):
  """Damages the array data of `step_dir`'s params: a byte of each of its data files."""
  params = os.path.join(step_dir, 'params')
  for path in [os.path.join(b, f) for b, _, fs in os.walk(params) for f in fs if b.endswith('/d')]:
    data = bytearray(open(path, 'rb').read())
    data[len(data) // 2] ^= 0xFF
    open(path, 'wb').write(bytes(data))


def _saved_toy_run(directory, steps):
  ckpt = checkpoint.Checkpointer(directory, every=2, keep=10, async_save=False)
  for step in steps:
    assert ckpt.save(step, *_toy(step))
  ckpt.close()


def test_damaged_steps_above_the_sound_one_are_set_aside_and_saved_again(tmp_path):
  """Steps 2-8; step 6's arrays and step 8's manifest damaged: the restore reads step 4,
  the saves at 6 and 8 happen, and both damaged steps are kept aside, a second damage of
  step 8 under another name."""
  directory = str(tmp_path)
  _saved_toy_run(directory, (2, 4, 6, 8))
  _flip_a_byte(os.path.join(directory, 'checkpoints', '6'))
  _damage_manifest(directory, 8)
  ckpt = checkpoint.Checkpointer(directory, every=2, keep=10, async_save=False)
  assert ckpt.restore()[0] == 4
  assert not ckpt.save(5, *_toy(5))
  assert ckpt.save(6, *_toy(6)) and ckpt.save(8, *_toy(8))
  ckpt.close()
  assert sorted(os.listdir(tmp_path / checkpoint.DAMAGED)) == [
    '6',
    '6.manifest.json',
    '8',
    '8.manifest.json',
  ]
  _damage_manifest(directory, 8)  # damaged again: kept beside the first
  ckpt = checkpoint.Checkpointer(directory, every=2, keep=10, async_save=False)
  assert ckpt.restore()[0] == 6
  assert ckpt.save(8, *_toy(8), force=True)
  ckpt.close()
  assert os.path.isdir(tmp_path / checkpoint.DAMAGED / '8.2')
  step, params = checkpoint.restore_params(directory)
  assert step == 8
  np.testing.assert_array_equal(params['w'], _toy(8)[0]['w'])


def test_evaluation_without_a_sound_checkpoint_names_the_damaged_steps(tmp_path):
  directory = str(tmp_path)
  _saved_toy_run(directory, (2, 4))
  for step in (2, 4):
    _damage_manifest(directory, step)
  with pytest.raises(FileNotFoundError, match=r'no sound checkpoint .*steps 2, 4 are damaged'):
    checkpoint.restore_params(directory)
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == [
    '2',
    '2.manifest.json',
    '4',
    '4.manifest.json',
  ]


def test_a_damaged_step_of_a_remote_workdir_is_set_aside(tmp_path, monkeypatch):
  """`gs://` (fake_gcs): the step's folder and manifest move as on a local disk."""
  import fake_gcs  # pylint: disable=g-import-not-at-top

  with fake_gcs.installed(monkeypatch, tmp_path) as local:
    directory = epath.Path('gs://bucket/run/checkpoints')
    (directory / '8' / 'params').mkdir(parents=True)
    (directory / '8' / 'params' / 'data').write_text('arrays')
    (directory / '8.manifest.json').write_text('{')
    where = checkpoint_integrity.set_aside(directory, 8)
    assert os.fspath(where) == 'gs://bucket/run/damaged_checkpoints/8'
    aside = local('gs://bucket/run/damaged_checkpoints')
    assert (aside / '8' / 'params' / 'data').read_text() == 'arrays'
    assert (aside / '8.manifest.json').read_text() == '{'
    assert os.listdir(local('gs://bucket/run/checkpoints')) == []

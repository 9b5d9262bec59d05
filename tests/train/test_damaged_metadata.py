"""A damaged checkpoint manifest or Orbax metadata falls back to the previous step, as damaged
array data does, with one line naming the step and why (issue 59, item 5).

They used to stop training and evaluation until the step folder was deleted by hand: a
truncated `<step>.manifest.json` with a JSONDecodeError traceback, an altered
`_CHECKPOINT_METADATA` with Orbax's `ValueError: Provided metadata contains unknown key`;
and a step whose manifest was missing was restored unchecked.
"""

import json
import logging
import os
import shutil

import main_runner
import pytest

from train import checkpoint
from train import trainer


def _config():
  return main_runner.config(num_steps=8, checkpoint_every=4)


@pytest.fixture(scope='module')
def finished(run_once):
  """A finished 8-step run (checkpoints 4 and 8): test_reliability.py's, shared."""
  return run_once('reliability_finished', lambda d: trainer.train_and_evaluate(_config(), d))


def _edit_json(path, change):
  with open(path) as f:
    value = json.load(f)
  change(value)
  with open(path, 'w') as f:
    json.dump(value, f)


def _truncate(path):
  with open(path) as f:
    text = f.read()
  with open(path, 'w') as f:
    f.write(text[: len(text) // 2])


MANIFEST = '8.manifest.json'
METADATA = os.path.join('8', '_CHECKPOINT_METADATA')
DAMAGE = {  # name: (file under checkpoints/, how it is damaged, the reason logged)
  'manifest truncated': (
    MANIFEST,
    _truncate,
    'its manifest 8.manifest.json is not valid JSON (Unterminated string',
  ),
  'manifest empty': (
    MANIFEST,
    lambda p: open(p, 'w').close(),
    'its manifest 8.manifest.json is empty',
  ),
  'manifest missing': (
    MANIFEST,
    os.remove,
    'its manifest 8.manifest.json is missing (the save did not complete)',
  ),
  'manifest without an item': (
    MANIFEST,
    lambda p: _edit_json(p, lambda m: m.pop('params')),
    'its manifest 8.manifest.json is not a manifest',
  ),
  'manifest without an array': (
    MANIFEST,
    lambda p: _edit_json(p, lambda m: m['params'].popitem()),
    "is not in both the checkpoint and its manifest",
  ),
  'metadata with a key Orbax refuses': (
    METADATA,
    lambda p: _edit_json(p, lambda m: m.update(custom_metadata={'a': 1}, b=2)),
    'its Orbax metadata _CHECKPOINT_METADATA cannot be read (ValueError: Provided '
    'metadata contains unknown key b, and the custom_metadata field is already defined.)',
  ),
  'metadata of the wrong type': (
    METADATA,
    lambda p: _edit_json(p, lambda m: m.update(item_handlers=5)),
    'its Orbax metadata _CHECKPOINT_METADATA cannot be read (ValueError: Object must be',
  ),
  'metadata truncated': (
    METADATA,
    _truncate,
    'its Orbax metadata _CHECKPOINT_METADATA cannot be read (JSONDecodeError',
  ),
  'metadata missing': (METADATA, os.remove, 'its Orbax metadata _CHECKPOINT_METADATA is missing'),
}


def _damaged_copy(finished, tmp_path, damage):
  workdir = str(tmp_path / 'run')
  shutil.copytree(finished, workdir)
  os.remove(os.path.join(workdir, 'results.json'))
  name, change, _ = DAMAGE[damage]
  change(os.path.join(workdir, 'checkpoints', name))
  return workdir


def _skipped(records, workdir, damage):
  """The warnings that say step 8 was skipped for `damage`'s reason: one is expected."""
  return [
    r.getMessage()
    for r in records
    if r.levelno == logging.WARNING
    and r.getMessage().startswith(
      f'The checkpoint at step 8 ({workdir}/checkpoints/8) is damaged: '
    )
    and DAMAGE[damage][2] in r.getMessage()
  ]


@pytest.mark.parametrize('damage', list(DAMAGE))
def test_damaged_metadata_falls_back_to_the_previous_step(finished, tmp_path, damage, caplog):
  workdir = _damaged_copy(finished, tmp_path, damage)
  with caplog.at_level(logging.WARNING):
    step, _ = checkpoint.restore_params(workdir)
  assert step == 4
  assert len(_skipped(caplog.records, workdir, damage)) == 1, caplog.text


@pytest.mark.parametrize('damage', ['manifest truncated', 'metadata with a key Orbax refuses'])
def test_training_and_evaluation_go_on_from_the_previous_step(finished, tmp_path, damage, caplog):
  """The two cases of the issue, through the trainer: evaluation reads step 4, training
  resumes from it and writes step 8 again, sound."""
  workdir = _damaged_copy(finished, tmp_path, damage)
  with caplog.at_level(logging.WARNING):
    trainer.evaluate(_config(), workdir)
  with open(os.path.join(workdir, 'eval_results.json')) as f:
    assert json.load(f)['step'] == 4
  assert len(_skipped(caplog.records, workdir, damage)) == 1, caplog.text
  results = trainer.train_and_evaluate(_config(), workdir)
  assert results['resumed_from_step'] == 4
  with open(os.path.join(finished, 'results.json')) as f:
    assert results['eval_loss'] == json.load(f)['eval_loss']  # the same run, resumed
  assert checkpoint.restore_params(workdir)[0] == 8  # step 8 written again, readable

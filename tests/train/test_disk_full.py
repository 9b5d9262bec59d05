"""A full disk, a read-only workdir, a workdir under a file: one line each, and nothing left
behind that a later run trusts or that blocks it (issue 59, item 6).

The disk is filled by `full_disk` (injected ENOSPC on the writes Python makes); the
run in a process (`test_a_full_disk_mid_run_...`) fills it while training.
"""

import asyncio
import errno
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import types

import full_disk
import jax.numpy as jnp
import main_runner
import pytest

from train import checkpoint
from train import metrics as metrics_lib
from train import validate
from train import workdir as workdir_lib

DISK_FULL = 'disk full: no space left on device writing '


@pytest.fixture(scope='module')
def config():
  return validate.resolved(main_runner.config(num_steps=8, checkpoint_every=4))


def test_a_full_disk_when_taking_the_lock_leaves_no_lock(tmp_path, config):
  """The lock used to be left empty, and every later run refused as 'in use by another
  trainer (pid None on None)' until it was deleted by hand."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  with full_disk.installed(tmp_path):
    with pytest.raises(workdir_lib.WorkdirError) as e:
      workdir_lib.open_run(str(workdir), config)
  assert str(e.value) == (
    f'{DISK_FULL}{workdir / workdir_lib.LOCK}; free space and re-run '
    f'the same command (no checkpoint was saved: it starts from step 0)'
  )
  assert os.listdir(workdir) == []
  workdir_lib.open_run(str(workdir), config).close()  # space again: it opens


@pytest.mark.parametrize('text', ['', '{"pid": 12', 'not json', '[]', '{"pid": 7}'])
def test_an_empty_or_unreadable_lock_is_stale(tmp_path, config, text, caplog):
  (tmp_path / workdir_lib.LOCK).write_text(text)
  with caplog.at_level(logging.WARNING):
    workdir_lib.open_run(str(tmp_path), config).close()
  assert 'Replacing a stale lock' in caplog.text and 'empty or unreadable' in caplog.text
  assert not (tmp_path / workdir_lib.LOCK).exists()


def test_a_live_trainers_lock_is_still_refused(tmp_path, config):
  lock = tmp_path / workdir_lib.LOCK
  me = {'pid': os.getpid(), 'host': socket.gethostname()}
  for holder in (me, {'pid': 1, 'host': 'another-host'}):
    lock.write_text(json.dumps(holder))
    with pytest.raises(
      workdir_lib.WorkdirError, match=rf'in use by another trainer \(pid {holder["pid"]} on '
    ):
      workdir_lib.open_run(str(tmp_path), config)
  # A lock still being written (empty for a moment) is read again, not taken.
  lock.write_text('')
  threading.Timer(0.1, lambda: lock.write_text(json.dumps(me))).start()
  with pytest.raises(workdir_lib.WorkdirError, match=rf'\(pid {os.getpid()} on '):
    workdir_lib.open_run(str(tmp_path), config)
  assert json.loads(lock.read_text()) == me


def test_a_json_file_is_replaced_whole_or_not_at_all(tmp_path):
  """A full disk left eval_results.json.tmp<pid> behind (and could empty the file)."""
  workdir_lib.write_json(tmp_path, 'eval_results.json', {'step': 4})
  with full_disk.installed(tmp_path):
    with pytest.raises(OSError) as e:
      workdir_lib.write_json(tmp_path, 'eval_results.json', {'step': 8})
  assert e.value.errno == errno.ENOSPC
  assert e.value.filename == os.fspath(tmp_path / 'eval_results.json')
  assert os.listdir(tmp_path) == ['eval_results.json']
  assert json.loads((tmp_path / 'eval_results.json').read_text()) == {'step': 4}


def test_a_resumed_metrics_file_keeps_its_rows_on_a_full_disk(tmp_path):
  """Resuming rewrites metrics.jsonl without the rows past the checkpoint: a full disk
  used to leave it empty."""
  path = tmp_path / metrics_lib.JSONL
  writer = metrics_lib.JsonlWriter(path)
  for step in (10, 20, 30):
    writer.write_scalars(step, {'train/loss': 1.0})
  writer.close()
  before = path.read_text()
  with full_disk.installed(tmp_path):
    with pytest.raises(OSError):
      metrics_lib.JsonlWriter(path, resume_step=20)
  assert path.read_text() == before and os.listdir(tmp_path) == [metrics_lib.JSONL]


def test_a_full_disk_creating_tensorboards_writer_is_an_oserror(tmp_path):
  """A re-run on a full disk once stopped with TensorFlow's traceback
  (ResourceExhaustedError, 'Could not initialize events writer'); the events file's first
  record fails, and main.py says an OSError of a full disk in one line."""
  with full_disk.installed(tmp_path):
    with pytest.raises(OSError) as e:
      metrics_lib.create_writer(tmp_path, enabled=True)
  assert e.value.errno == errno.ENOSPC
  assert e.value.filename == os.fspath(tmp_path / 'tensorboard')
  assert workdir_lib.write_failure(tmp_path, e.value, training=True) == (
    f'{DISK_FULL}{tmp_path / "tensorboard"}; free space and re-run the same command '
    f'(no checkpoint was saved: it starts from step 0)'
  )


def test_a_full_disk_in_a_background_save_is_one_error_without_orbax_tracebacks(tmp_path, caplog):
  """Orbax's threads logged 9 tracebacks (511 lines) of a full disk; the save's error
  then came as a ValueError traceback from `save` or `close`."""
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  params, opt_state = {'w': jnp.arange(3.0)}, {'m': jnp.zeros(3)}
  assert ckpt.save(4, params, opt_state, force=True)
  ckpt.manager.wait_until_finished()
  orbax_files = lambda path: '.manifest.json' not in path  # the manifest is written
  with full_disk.installed(tmp_path / 'checkpoints', when=orbax_files):
    with caplog.at_level(logging.INFO), pytest.raises(checkpoint.CheckpointSaveError) as e:
      try:
        ckpt.save(8, params, opt_state, force=True)
      finally:
        ckpt.close()
  assert str(e.value) == (
    f'{DISK_FULL}{tmp_path / "checkpoints"}; free space and re-run '
    f'the same command to resume from step 4'
  )
  assert not [r for r in caplog.records if r.exc_info or 'No space' in r.getMessage()]
  assert main_runner.committed_steps(str(tmp_path)) == [4]
  assert sorted(os.listdir(tmp_path / 'checkpoints'))[:2] == ['4', '4.manifest.json']
  assert not (tmp_path / 'checkpoints' / '8.manifest.json').exists()


def test_tensorstores_late_callbacks_after_a_failed_save_are_not_printed(tmp_path, monkeypatch):
  """After a failed save, TensorStore's writes still in flight finish on the event loop
  Orbax has closed: on a real full disk, tens of 'RuntimeError: Event loop is closed'
  tracebacks (sys.unraisablehook) after the run's one line. Those are dropped; any other
  unraisable exception still goes to the hook."""
  seen = []
  monkeypatch.setattr(sys, 'unraisablehook', seen.append)
  checkpoint.Checkpointer(str(tmp_path)).close()

  def unraisable(call):
    try:
      call()
    except RuntimeError as e:
      return types.SimpleNamespace(
        exc_type=RuntimeError, exc_value=e, exc_traceback=e.__traceback__, err_msg=None, object=None
      )

  loop = asyncio.new_event_loop()
  loop.close()
  late = unraisable(lambda: loop.call_soon_threadsafe(print))
  other = unraisable(lambda: (_ for _ in ()).throw(RuntimeError('Event loop is closed')))
  sys.unraisablehook(late)
  sys.unraisablehook(other)
  assert seen == [other]


def test_no_manifest_is_left_without_its_step(tmp_path):
  """Step 8's background writes fail, then step 12's manifest cannot be written: neither
  manifest stays behind (a real full disk left 12.manifest.json, or an empty one)."""
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  params, opt_state = {'w': jnp.arange(3.0)}, {'m': jnp.zeros(3)}
  assert ckpt.save(4, params, opt_state, force=True)
  ckpt.manager.wait_until_finished()
  full = lambda path: '.manifest.json' not in path or '12.manifest.json' in path
  with full_disk.installed(tmp_path / 'checkpoints', when=full):
    with pytest.raises(checkpoint.CheckpointSaveError, match=f'^{DISK_FULL}'):
      try:
        ckpt.save(8, params, opt_state, force=True)
        ckpt.save(12, params, opt_state, force=True)
      finally:
        ckpt.close()
  assert [f for f in sorted(os.listdir(tmp_path / 'checkpoints')) if 'manifest' in f] == [
    '4.manifest.json'
  ]


def test_a_workdir_under_a_file_is_one_line(tmp_path, config):
  (tmp_path / 'some_file').write_text('')
  for path in (tmp_path / 'some_file' / 'run', tmp_path / 'some_file'):
    with pytest.raises(workdir_lib.WorkdirError) as e:
      workdir_lib.open_run(str(path), config)
    assert str(e.value) == (
      f'cannot use {path} as the workdir: {tmp_path / "some_file"} is '
      f'a file, not a folder; name a folder in --workdir'
    )


def test_a_read_only_workdir_is_one_line(tmp_path, config):
  for path, file in ((tmp_path, tmp_path / workdir_lib.LOCK), (tmp_path / 'new', None)):
    with full_disk.read_only(tmp_path), pytest.raises(workdir_lib.WorkdirError) as e:
      workdir_lib.open_run(str(path), config)
    where = f' ({file})' if file else ''
    assert str(e.value) == f'cannot write in the workdir {path}: Read-only file system{where}'
  assert os.listdir(tmp_path) == []


# main.py, with the workdir's disk full from the moment every one of the (comma-separated)
# paths FULL_AFTER exists in its checkpoints/ folder.
FULL_MAIN = r'''
import os, runpy, sys
sys.path.insert(0, 'tests')
import full_disk
workdir = os.path.abspath(os.environ['FULL_WORKDIR'])
after = [os.path.join(workdir, 'checkpoints', p) for p in os.environ['FULL_AFTER'].split(',')]
sys.argv[0] = 'main.py'
with full_disk.installed(workdir, when=lambda path: all(map(os.path.exists, after))):
  runpy.run_path('main.py', run_name='__main__')
'''


@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line_and_the_same_command_resumes(tmp_path):
  """The disk fills up once step 8 is saved (synchronously, so that the step at which it
  fills is the same in every run): the metrics file's next write fails. The run
  stops with one line (no traceback) naming the file and the step the re-run resumes from;
  nothing is left that a later run trusts or that blocks it, and the same command then
  finishes the run. (A full disk in Orbax's background writes: the test above.)"""
  workdir = str(tmp_path / 'run')
  kwargs = main_runner.popen_kwargs()
  kwargs['env'].update(FULL_WORKDIR=workdir, FULL_AFTER='8')
  command = main_runner.command(workdir, num_steps=16, checkpoint_every=4, async_checkpoints=False)
  proc = subprocess.run([sys.executable, '-c', FULL_MAIN, *command[2:]], timeout=300, **kwargs)
  assert proc.returncode == 1, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last == (
    f'Error: {DISK_FULL}{workdir}/metrics.jsonl; free space and re-run the '
    f'same command to resume from step 8'
  ), proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert proc.stderr.lower().count('no space left on device') == 1, proc.stderr[-3000:]
  assert main_runner.committed_steps(workdir) == [4, 8]
  left = [os.path.join(base, f) for base, _, files in os.walk(workdir) for f in files]
  assert not [f for f in left if '.tmp' in f or f.endswith(workdir_lib.LOCK)], left

  proc = subprocess.run(command, timeout=300, **main_runner.popen_kwargs())
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'Resumed from the checkpoint at step 8' in proc.stdout
  with open(os.path.join(workdir, 'results.json')) as f:
    assert json.load(f)['steps'] == 16

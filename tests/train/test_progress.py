"""The progress scalars (steps per second, uptime) and the TensorBoard events, both
written without TensorFlow."""

import subprocess
import sys

import main_runner
from tensorboard.backend.event_processing import event_file_loader

from train import progress
from train import tensorboard


class _Scalars:
  def __init__(self):
    self.rows = []

  def write_scalars(self, step, scalars):
    self.rows.append((step, dict(scalars)))


def test_steps_per_second_since_the_last_report_never_at_the_first_call(monkeypatch):
  clock = iter([0.0, 10.0, 11.0, 13.0, 14.0, 15.0, 16.0, 18.0, 21.0])
  monkeypatch.setattr(progress.time, 'monotonic', lambda: next(clock))
  writer = _Scalars()
  report = progress.ReportProgress(num_train_steps=8, writer=writer, every_steps=2)  # t=0
  assert not report(2)  # t=10: the first call starts the clock, even at a multiple of 2
  assert not report(3)  # t=11
  with report.timed('eval'):  # 13 -> 14
    pass
  assert report(4)  # t=15: two steps in 5 s
  assert writer.rows == [(4, {'steps_per_sec': 0.4}), (4, {'uptime': 15.0})]
  assert not report(5) and report(6)  # t=16, t=18: two steps in 3 s
  assert writer.rows[-2:] == [(6, {'steps_per_sec': 2 / 3}), (6, {'uptime': 18.0})]
  assert report.time_per_part == {'eval': 1.0}


def test_events_are_tensorboards_records(tmp_path):
  writer = tensorboard.EventWriter(tmp_path / 'tb')
  writer.write_scalars(3, {'train/loss': 0.25, 'eval/accuracy': 1})
  writer.write_scalars(5, {'train/loss': 0.125})
  writer.close()
  (path,) = (tmp_path / 'tb').glob('events.out.tfevents.*.v2')
  events = list(event_file_loader.LegacyEventFileLoader(str(path)).Load())  # checks each CRC
  assert events[0].file_version == 'brain.Event:2'
  scalars = [(e.step, v.tag, v.simple_value) for e in events[1:] for v in e.summary.value]
  assert scalars == [(3, 'train/loss', 0.25), (3, 'eval/accuracy', 1.0), (5, 'train/loss', 0.125)]


def test_the_trainer_and_its_writers_load_no_tensorflow():
  """TensorFlow is about 8 s of CPU to import; a run on an in-memory dataset needs none."""
  code = (
    'import sys, train.trainer, train.metrics; '
    'print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "clu")))'
  )
  done = subprocess.run([sys.executable, '-c', code], **main_runner.popen_kwargs(), check=True)
  assert done.stdout.strip() == '[]'

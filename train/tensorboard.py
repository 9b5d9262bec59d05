"""TensorBoard event files written without TensorFlow: scalars, one event per step.

    writer = tensorboard.EventWriter(workdir / 'tensorboard')
    writer.write_scalars(300, {'train/loss': 0.41, 'train/accuracy': 0.87})
    writer.close()

The records and protos are TensorBoard's own (the `tensorboard` package: its record
writer, `Event` and `Summary`), written through `epath` (a local folder or gs://), in
TensorFlow's file name pattern. clu's SummaryWriter writes the same through `tf.summary`,
and importing it imports TensorFlow: about 8 s of CPU at the start of every run, for a
few scalars (a run on an in-memory or generated dataset needs no TensorFlow otherwise).
"""

import os
import socket
import time
from typing import Any, Mapping

from etils import epath
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import record_writer


class EventWriter:
  """`logdir/events.out.tfevents.<time>.<host>.<pid>.0.v2`, flushed after every step's
  scalars (values as float32 `simple_value`s, which TensorBoard's scalar plugin reads).

  An OSError (a full disk) names the file.
  """

  def __init__(self, logdir):
    logdir = epath.Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    name = f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.0.v2'
    self.path = logdir / name
    self._file = self.path.open('wb')
    self._records = record_writer.RecordWriter(self._file)
    self._write(event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2'))

  def _write(self, event: event_pb2.Event) -> None:
    try:
      self._records.write(event.SerializeToString())
      self._file.flush()
    except OSError as e:
      if e.filename is None:
        e.filename = os.fspath(self.path)
      raise

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
    self._write(
      event_pb2.Event(
        wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)
      )
    )

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()

"""A dependency-free TensorBoard scalar writer (TFRecord files of `Event` protos).

Neither `tensorboard` nor TensorFlow is needed to write the events (the
digits default runs without importing TensorFlow); TensorBoard reads them as
usual. Only scalars: `Event{wall_time=1, step=2, file_version=3, summary=5}`,
`Summary{value=1}`, `Summary.Value{tag=1, simple_value=2}`.
"""
import os
import socket
import struct
import time


def _crc32c_table():
  table = []
  for i in range(256):
    crc = i
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    table.append(crc)
  return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for b in data:
    crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
  out = bytearray()
  while True:
    byte, n = n & 0x7F, n >> 7
    out.append(byte | (0x80 if n else 0))
    if not n:
      return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
  return _varint((number << 3) | wire_type) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
  return _field(number, 2, _varint(len(data)) + data)


def _event(step: int, *, summary: bytes = b'', file_version: str = '') -> bytes:
  msg = _field(1, 1, struct.pack('<d', time.time())) + _field(2, 0, _varint(step))
  if file_version:
    msg += _bytes_field(3, file_version.encode())
  if summary:
    msg += _bytes_field(5, summary)
  return msg


def _record(data: bytes) -> bytes:
  length = struct.pack('<Q', len(data))
  return length + struct.pack('<I', _masked_crc(length)) + data + struct.pack(
      '<I', _masked_crc(data))


class SummaryWriter:
  """Appends scalar events to `logdir/events.out.tfevents.<time>.<host>`."""

  def __init__(self, logdir: str):
    os.makedirs(logdir, exist_ok=True)
    name = f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}'
    self.path = os.path.join(logdir, name)
    self._file = open(self.path, 'ab')
    self._file.write(_record(_event(0, file_version='brain.Event:2')))

  def scalar(self, tag: str, value: float, step: int) -> None:
    value_msg = _bytes_field(1, tag.encode()) + _field(2, 5, struct.pack('<f', float(value)))
    self._file.write(_record(_event(step, summary=_bytes_field(1, value_msg))))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()

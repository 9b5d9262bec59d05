"""train.preemption: SIGTERM and Ctrl-C (SIGINT) become a flag the training loop acts on.

In-process: the signals are raised in this process inside the context manager.
(tests/train/test_interrupt.py runs the trainer in a real process under SIGTERM.)
"""

import signal

import pytest

from train import preemption


def send(sig):
  signal.raise_signal(sig)  # in this thread: the Python handler runs before it returns


@pytest.fixture
def default_sigint():
  """Python's own Ctrl-C handler, whatever this process started with: a background job
  of a non-interactive shell starts with SIGINT ignored, which the context manager
  restores for the second Ctrl-C (so the test failed when pytest ran in the background)."""
  started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, started_with)


def test_ctrl_c_sets_the_flag_and_a_second_one_interrupts(default_sigint):
  before = signal.getsignal(signal.SIGINT)
  with preemption.StopOnSignal() as stop:
    send(signal.SIGINT)  # without the handler: KeyboardInterrupt here
    assert stop.requested and stop.signal_name == 'SIGINT'
    with pytest.raises(KeyboardInterrupt):
      send(signal.SIGINT)  # the second Ctrl-C is not waited for
  assert signal.getsignal(signal.SIGINT) is before


def test_sigterm_sets_the_flag_every_time():
  before = signal.getsignal(signal.SIGTERM)
  with preemption.StopOnSignal() as stop:
    send(signal.SIGTERM)
    send(signal.SIGTERM)  # a repeated SIGTERM still waits for the checkpoint
    assert stop.requested and stop.signal_name == 'SIGTERM'
  assert signal.getsignal(signal.SIGTERM) is before


def test_the_first_signal_names_the_stop():
  # train.sweep answers Ctrl-C by sending its run SIGTERM too: the run still says Ctrl-C.
  with preemption.StopOnSignal() as stop:
    send(signal.SIGINT)
    send(signal.SIGTERM)
    assert stop.requested and stop.signal_name == 'SIGINT'


def test_disabled_installs_nothing():
  before = signal.getsignal(signal.SIGINT)
  with preemption.StopOnSignal(enabled=False):
    assert signal.getsignal(signal.SIGINT) is before

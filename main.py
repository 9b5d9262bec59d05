"""Runs an experiment: train and evaluate, or evaluate a checkpoint.

    python main.py --config=configs/cifar10_nystrom.py --workdir=/tmp/run
    python main.py --config=configs/cifar10.py:linear --workdir=/tmp/run \
        --config.model.num_heads=8 --config.train.num_epochs=10
    python main.py --config=configs/cifar10_nystrom.py --workdir=/tmp/run --mode=eval

Re-running a train command resumes from the workdir's newest checkpoint.
Multi-host: pass --coordinator_address/--num_processes/--process_id, or run
on a pod/cluster whose environment JAX recognises (--distributed=auto).
"""
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from train import checkpoint
from train import sharding
from train import trainer
from train import validate
from train import workdir

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file, e.g. configs/default.py or configs/mnist.py:super.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics, results.')
_MODE = flags.DEFINE_enum('mode', 'train', ['train', 'eval'],
                          'train: train and evaluate (resuming if possible); '
                          'eval: evaluate the newest checkpoint of --workdir.')
_RESTART = flags.DEFINE_bool(
    'restart', False, 'Start over in a --workdir that holds a run of another config: the '
    'old run is moved aside to <workdir>.replaced-<time>, never deleted.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', '',
                                   'host:port of process 0 for jax.distributed.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', 0, 'Number of processes (multi-host).')
_PROCESS_ID = flags.DEFINE_integer('process_id', -1, 'Index of this process (multi-host).')
_TIMEOUT = flags.DEFINE_integer(
    'distributed_timeout_s', 300, 'Seconds to wait for every process to connect.')
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed', 'auto', ['auto', 'on', 'off'],
    'auto: jax.distributed.initialize with the flags above, or without arguments '
    'when the environment describes a cluster; on: always; off: never.')
flags.mark_flags_as_required(['config', 'workdir'])


def _innermost(error: BaseException) -> str:
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  return str(error.args[0]) if error.args else type(error).__name__


def _one_line(error: flags.Error) -> str:
  """The flag error; for a config file whose get_config raised, its last line (the
  exception's message) in place of the traceback that ml_collections puts there."""
  head, sep, trace = str(error).partition('Error whilst parsing config file:')
  lines = trace.strip().splitlines()
  frames = [i for i, line in enumerate(lines) if line.startswith('  File ')]
  if not sep or not frames:
    return str(error)
  # After the last frame (its source lines are indented): 'ValueError: message'.
  exception = [line for line in lines[frames[-1]:] if line and not line[0].isspace()]
  return head + ' '.join(exception).split(': ', 1)[-1]


def parse_flags(argv, flag_values=flags.FLAGS):
  """absl's flag parsing, with a bad --config (its argument, or an override) reported in
  one line."""
  try:
    return flag_values(argv)
  except flags.Error as e:
    sys.exit(f'Error: {_one_line(e)} (--helpfull lists the flags)')
  except (AttributeError, KeyError, TypeError, ValueError) as e:  # a --config.x override
    lines = _innermost(e).splitlines()
    name = lines[0].strip("'\"")
    hint = ('; ' + lines[1][0].lower() + lines[1][1:]) if len(lines) > 1 else ''
    flag = next((a.split('=')[0] for a in argv[1:] if a.split('=')[0].endswith(f'.{name}')),
                '')
    sys.exit(f'Invalid config override {flag}: no field {name!r}{hint}'.replace(' :', ':'))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  try:
    sharding.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value,
                                    _PROCESS_ID.value, _DISTRIBUTED.value, _TIMEOUT.value)
  except (ValueError, ConnectionError) as e:
    sys.exit(f'Error: {e}')
  try:
    if _MODE.value == 'train':
      trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value, restart=_RESTART.value)
    else:
      trainer.evaluate(_CONFIG.value, _WORKDIR.value)
  except validate.ConfigError as e:
    logging.error('Invalid config: %s', e)
    sys.exit(f'Invalid config: {e}')
  except (workdir.WorkdirError, checkpoint.CheckpointSaveError) as e:
    sys.exit(f'Error: {e}')
  except FileNotFoundError as e:  # --mode=eval without a checkpoint
    sys.exit(f'Error: {e}')
  except FloatingPointError as e:  # a non-finite loss: the message names the step
    sys.exit(f'Error: {e}')


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

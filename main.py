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

from train import sharding
from train import trainer
from train import validate

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file, e.g. configs/default.py or configs/mnist.py:super.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics, results.')
_MODE = flags.DEFINE_enum('mode', 'train', ['train', 'eval'],
                          'train: train and evaluate (resuming if possible); '
                          'eval: evaluate the newest checkpoint of --workdir.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', '',
                                   'host:port of process 0 for jax.distributed.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', 0, 'Number of processes (multi-host).')
_PROCESS_ID = flags.DEFINE_integer('process_id', -1, 'Index of this process (multi-host).')
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed', 'auto', ['auto', 'on', 'off'],
    'auto: jax.distributed.initialize with the flags above, or without arguments '
    'when the environment describes a cluster; on: always; off: never.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  sharding.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value,
                                  _PROCESS_ID.value, _DISTRIBUTED.value)
  try:
    if _MODE.value == 'train':
      trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    else:
      trainer.evaluate(_CONFIG.value, _WORKDIR.value)
  except validate.ConfigError as e:
    logging.error('Invalid config: %s', e)
    sys.exit(f'Invalid config: {e}')
  except FileNotFoundError as e:  # --mode=eval without a checkpoint
    sys.exit(f'Error: {e}')
  except FloatingPointError as e:  # a non-finite loss: the message names the step
    sys.exit(f'Error: {e}')


if __name__ == '__main__':
  app.run(main)

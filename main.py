"""Runs an experiment: train and evaluate, or evaluate a checkpoint.

    python main.py --config=configs/cifar10_nystrom.py              # in runs/cifar10_nystrom
    python main.py --config=configs/cifar10.py:linear --workdir=/tmp/run \
        --config.model.num_heads=8 --config.train.num_epochs=10
    python main.py --config=configs/cifar10_nystrom.py --mode=eval

Without --workdir, the workdir is runs/<config>[-<argument>][-<hash of the
--config.* overrides>] (`train/workdir/naming.py`), printed on the first line.
Re-running a train command resumes from the workdir's newest checkpoint; the same
command with --mode=eval evaluates that run, on the dataset its config.json names
unless --config.dataset.* overrides say otherwise (`train/cli.py` does the work).
Progress goes to stdout; absl logs only warnings unless --verbosity is given
(--verbosity=0: every INFO line, the metric lines included).
Multi-host: pass --coordinator_address/--num_processes/--process_id, or run
on a pod/cluster whose environment JAX recognises (--distributed=auto).
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from train import cli

config_flags.DEFINE_config_file(
  'config', None, 'Experiment config file, e.g. configs/default.py or configs/mnist.py:super.'
)
_WORKDIR = flags.DEFINE_string(
  'workdir',
  None,
  'Directory for checkpoints, metrics, results; default: '
  'runs/<config>[-<argument>][-<hash of the --config.* overrides>].',
)
_MODE = flags.DEFINE_enum(
  'mode',
  'train',
  ['train', 'eval'],
  'train: train and evaluate (resuming if possible); '
  'eval: evaluate the newest checkpoint of --workdir.',
)
_RESTART = flags.DEFINE_bool(
  'restart',
  False,
  'Start over in a --workdir that holds a run of another config: the '
  'old run is moved aside to <workdir>.replaced-<time>, never deleted.',
)
_COORDINATOR = flags.DEFINE_string(
  'coordinator_address', '', 'host:port of process 0 for jax.distributed.'
)
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', 0, 'Number of processes (multi-host).')
_PROCESS_ID = flags.DEFINE_integer('process_id', -1, 'Index of this process (multi-host).')
_TIMEOUT = flags.DEFINE_integer(
  'distributed_timeout_s', 300, 'Seconds to wait for every process to connect.'
)
_DISTRIBUTED = flags.DEFINE_enum(
  'distributed',
  'auto',
  ['auto', 'on', 'off'],
  'auto: jax.distributed.initialize with the flags above, or without arguments '
  'when the environment describes a cluster; on: always; off: never.',
)
flags.mark_flags_as_required(['config'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  cli.run(
    flags.FLAGS['config'],
    workdir=_WORKDIR.value,
    mode=_MODE.value,
    restart=_RESTART.value,
    verbose=flags.FLAGS['verbosity'].present,
    distributed=dict(
      coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value,
      mode=_DISTRIBUTED.value,
      timeout_s=_TIMEOUT.value,
    ),
  )


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)

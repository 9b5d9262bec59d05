"""Runs an experiment: train and evaluate, or evaluate a checkpoint.

    python main.py --config=configs/cifar10_nystrom.py              # in runs/cifar10_nystrom
    python main.py --config=configs/cifar10.py:linear --workdir=/tmp/run \
        --config.model.num_heads=8 --config.train.num_epochs=10
    python main.py --config=configs/cifar10_nystrom.py --mode=eval

Without --workdir, the workdir is runs/<config>[-<argument>][-<hash of the
--config.* overrides>] (`default_workdir`), printed on the first line.
Re-running a train command resumes from the workdir's newest checkpoint; the same
command with --mode=eval evaluates that run (`eval_workdir`), on the dataset its
config.json names unless --config.dataset.* overrides say otherwise (`eval_config`).
Progress goes to stdout; absl logs only warnings unless --verbosity is given
(--verbosity=0: every INFO line, clu's metric lines included).
Multi-host: pass --coordinator_address/--num_processes/--process_id, or run
on a pod/cluster whose environment JAX recognises (--distributed=auto).
"""

import hashlib
import itertools
import json
import os
import re
import shlex
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

import data
from train import checkpoint
from train import logs
from train import pyfile
from train import sharding
from train import trainer
from train import validate
from train import workdir

_CONFIG = config_flags.DEFINE_config_file(
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

RUNS = 'runs'


def default_workdir(config_arg: str, overrides=None, evaluating: bool = False) -> str:
  """The workdir of a config named on the command line, when --workdir is not given.

  'configs/cifar10_nystrom.py' -> 'runs/cifar10_nystrom'; 'configs/cifar10.py:linear'
  -> 'runs/cifar10-linear'; 'configs/lra/listops.py:performer' ->
  'runs/lra/listops-performer'; any --config.* overrides (a {field: value} dict) add a
  short hash of their sorted values, so another config never shares the folder.
  `evaluating` (--mode=eval): overrides of what an evaluation may change
  (`workdir.MAY_CHANGE`: the eval split, batch size, data location) name the same run.
  """
  if evaluating and overrides:
    overrides = {k: v for k, v in overrides.items() if not workdir.may_change(k)}
  path, _, arg = config_arg.partition(':')
  path = os.path.normpath(path)
  parts = path.split(os.sep)
  if 'configs' in parts:  # relative to the (last) configs/ folder
    parts = parts[len(parts) - parts[::-1].index('configs') :]
  else:
    parts = parts[-1:]
  parts[-1] = os.path.splitext(parts[-1])[0]
  name = os.path.join(*parts)
  if arg:
    name += '-' + (re.sub(r'[^A-Za-z0-9._]+', '-', arg).strip('-') or 'arg')
  if overrides:
    text = json.dumps(dict(overrides), sort_keys=True, default=repr)
    name += '-' + hashlib.sha256(text.encode()).hexdigest()[:8]
  return os.path.join(RUNS, name)


def eval_workdir(config_arg: str, overrides=None, holds_run=None) -> str:
  """The workdir --mode=eval evaluates when --workdir is not given.

  The first that holds a run (`holds_run(path)`, default: it has a config.json) of
  the workdirs of `config_arg` with all the --config.* `overrides`, then with fewer of
  those an evaluation may change (`workdir.MAY_CHANGE`), fewest left out first: the
  training command plus --mode=eval evaluates the run it trained, and
  `--config.dataset.eval_split=train` added evaluates it too. None holds a run:
  `default_workdir(..., evaluating=True)`.
  """
  overrides = dict(overrides or {})
  holds_run = holds_run or (lambda path: os.path.exists(os.path.join(path, workdir.CONFIG)))
  changeable = sorted(k for k in overrides if workdir.may_change(k))
  for n in range(len(changeable) + 1):
    for left_out in itertools.combinations(changeable, n):
      path = default_workdir(config_arg, {k: v for k, v in overrides.items() if k not in left_out})
      if holds_run(path):
        return path
  return default_workdir(config_arg, overrides, evaluating=True)


def eval_config(config, stored, overrides=None):
  """`config` with its `dataset` fields read from a run's stored config, for --mode=eval.

  `stored`: the run's config.json (a ConfigDict, or None: `config` as it is). Each
  field of `config.dataset` takes the stored value (source, data_dir, holdout, splits,
  ...) unless a --config.* override (`overrides`, {'dataset.eval_split': ...}) sets
  it, so an evaluation reads the data the run was trained on, not the config file's
  default (a TFDS download, for a run trained from .npz files).
  """
  if stored is None or 'dataset' not in stored:
    return config
  overrides = overrides or {}
  config = config.copy_and_resolve_references()
  for key, value in stored.dataset.items():
    field = f'dataset.{key}'
    if key in config.dataset and not any(
      k == field or k.startswith(field + '.') for k in overrides
    ):
      config.dataset[key] = value
  return config


# The flags the command of an offline hint sets itself (`offline_hint`).
DATA_FLAGS = ('--config.dataset.source', '--config.dataset.data_dir', '--config.dataset.download')


def offline_hint(argv, config_arg: str, config) -> str:
  """What a failed download adds to its message: the command `argv` again, reading the
  dataset from .npz files (`data.arrays_source`), and for the CIFAR-10 ViT at its base
  size, the size a CPU can train."""
  arrays = data.arrays_source(config)
  if arrays is None:
    return ''
  flags_to_add, files = arrays
  args, skip = [], False
  for arg in argv[1:]:
    if not skip and not arg.startswith(tuple(f + '=' for f in DATA_FLAGS)):
      if arg in DATA_FLAGS:
        skip = True  # '--flag value': the value is the next argument
      else:
        args.append(arg)
    else:
      skip = False
  command = shlex.join(['python', 'main.py', *args, *flags_to_add])
  hint = f', or train from .npz files ({files}): {command}'
  path, _, arg = config_arg.partition(':')
  if os.path.basename(path) in ('cifar10.py', 'cifar10_nystrom.py') and 'size=small' not in arg:
    a = config.attention
    small = (
      os.path.join(os.path.dirname(path), 'cifar10.py')
      + f':{a.mechanism}'
      + (f',projection={a.projection}' if a.projection != 'standard' else '')
      + ',size=small'
    )
    hint += (
      f'; on a CPU, use --config={small}: this base size trains at about 12 '
      f'examples/s on 2 cores, so its 100 epochs would take about 5 days'
    )
  return hint


def parse_flags(argv, flag_values=flags.FLAGS):
  """absl's flag parsing, with a bad --config (its argument, or an override) reported in
  one line."""
  try:
    rest = flag_values(argv)
    if 'config' in flag_values:  # ml_collections defers a file it could not read to its use
      getattr(flag_values['config'].value, 'to_dict', None)
  except flags.Error as e:
    sys.exit(f'Error: {pyfile.config_flag_error(e, argv)} (--helpfull lists the flags)')
  except (AttributeError, KeyError, TypeError, ValueError) as e:  # a --config.x override
    sys.exit(pyfile.config_flag_error(e, argv))
  except OSError as e:  # the --config file cannot be read ('[Errno 2] No such file ...')
    reason = str(e).strip().splitlines()[-1].strip()
    path = next((a.split('=', 1)[1] for a in argv[1:] if a.startswith('--config=')), '')
    sys.exit(f'Error: flag --config={path}: {reason} (--helpfull lists the flags)')
  return rest


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logs.quiet_logs(flags.FLAGS['verbosity'].present)
  try:  # a bad field (a misspelt mechanism, say) is one line before the workdir line
    validate.validate_config(_CONFIG.value)
  except validate.ConfigError as e:
    sys.exit(f'Invalid config: {e}')
  config_flag = flags.FLAGS['config']
  config_arg = config_flags.get_config_filename(config_flag)
  overrides = config_flags.get_override_values(config_flag)
  evaluating = _MODE.value == 'eval'
  path = _WORKDIR.value or (
    eval_workdir(config_arg, overrides) if evaluating else default_workdir(config_arg, overrides)
  )
  print(f'workdir {path}', flush=True)
  config = _CONFIG.value
  if evaluating:  # the run's own dataset, unless the command names another
    try:
      config = eval_config(config, workdir.load_config(path), overrides)
    except workdir.WorkdirError as e:  # a damaged config.json: one line
      sys.exit(f'Error: {e}')
  try:
    sharding.initialize_distributed(
      _COORDINATOR.value,
      _NUM_PROCESSES.value,
      _PROCESS_ID.value,
      _DISTRIBUTED.value,
      _TIMEOUT.value,
    )
  except (ValueError, ConnectionError) as e:
    sys.exit(f'Error: {e}')
  try:
    if _MODE.value == 'train':
      trainer.train_and_evaluate(config, path, restart=_RESTART.value)
    else:
      trainer.evaluate(config, path)
  except validate.ConfigError as e:
    sys.exit(f'Invalid config: {e}')
  except (workdir.WorkdirError, checkpoint.CheckpointSaveError) as e:
    sys.exit(f'Error: {e}')
  except FileNotFoundError as e:  # --mode=eval without a checkpoint
    sys.exit(f'Error: {e}')
  except FloatingPointError as e:  # a non-finite loss: the message names the step
    sys.exit(f'Error: {e}')
  except OSError as e:  # a full disk, a read-only workdir: one line naming the path
    message = workdir.write_failure(path, e, training=_MODE.value == 'train')
    if message is None:
      raise
    sys.exit(f'Error: {message}')
  except data.DownloadError as e:  # TFDS without a network: how to train from files
    sys.exit(f'Error: {e}{offline_hint(sys.argv, config_arg, config)}')


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

"""main.py's work: its flags read, the run started, every expected failure in one line.

    app.run(main, flags_parser=cli.parse_flags)   # a bad --config: one line, exit status 1
    cli.run(flags.FLAGS['config'], workdir=..., mode='train', ...)

`run` validates the config (a misspelt field is one line before anything else), prints
the workdir on the first line (`workdir.default_workdir` without --workdir; with
--mode=eval, `workdir.eval_workdir`, and the run's own dataset: `eval_config`), starts
jax.distributed, then trains or evaluates. Each error a user can cause or meet (a bad
config, a workdir of another run, a full disk, a download without a network: with
`offline_hint`) ends the process with one line; anything else is a traceback.
"""

import os
import shlex
import sys
import traceback
from typing import Any, Dict, Optional

from absl import flags
import jax
from ml_collections import config_flags

import data
from train import checkpoint
from train import logs
from train import pyfile
from train import sharding
from train import trainer
from train import validate
from train import workdir as workdir_lib

QUICK_START = 'configs/default.py'  # README.md's quick start


def config_argument(argv) -> Optional[str]:
  """The value of --config in `argv` ('--config=x' or '--config x'), or None."""
  for i, arg in enumerate(argv[1:], start=1):
    if arg.startswith('--config='):
      return arg.split('=', 1)[1]
    if arg == '--config' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def config_file_error(spec: Optional[str]) -> Optional[str]:
  """One line for a --config that cannot give a config, or None when it can: a missing
  flag, a file that does not load (SyntaxError, ImportError, ...), a `get_config` that
  raises (the exception's type, message and line in the file) or returns no config."""
  if spec is None:
    return f'--config is missing: name a config file, e.g. --config={QUICK_START} (the quick start)'
  path = spec.partition(':')[0]
  if not os.path.isfile(path):
    return None  # absl's own line names the file and the OSError (`parse_flags`)
  try:
    config = pyfile.call(spec, 'get_config')
  except ValueError as e:
    return f'flag --config={spec}: {str(e).removeprefix(f"{spec!r}: ")}'
  except Exception as e:  # pylint: disable=broad-except  (its own code raised: one line)
    frames = [fr for fr in traceback.extract_tb(e.__traceback__) if fr.filename.endswith(path)]
    where = f' (line {frames[-1].lineno})' if frames else ''
    return f'flag --config={spec}: get_config() raised {type(e).__name__}: {e}{where}'
  if config is None:
    return (
      f'flag --config={spec}: get_config() returned None; it must return the config '
      '(an ml_collections.ConfigDict): a missing return statement?'
    )
  return None


def parse_flags(argv, flag_values=flags.FLAGS):
  """absl's flag parsing, with a bad --config (missing, a file that does not give a config,
  its argument, or an override) reported in one line."""
  if 'config' in flag_values and not any(a in ('--help', '--helpfull') for a in argv[1:]):
    problem = config_file_error(config_argument(argv))
    if problem:
      sys.exit(f'Error: {problem} (--helpfull lists the flags)')
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


def out_of_memory(error: Exception, workdir: str) -> Optional[str]:
  """One line for XLA's RESOURCE_EXHAUSTED (its allocation and what to lower), else None."""
  text = str(error)
  if 'RESOURCE_EXHAUSTED' not in text:
    return None
  first = ' '.join(text.split('RESOURCE_EXHAUSTED:', 1)[-1].split())[:200]
  return (
    f'out of memory ({first}); lower config.dataset.batch_size (and eval_batch_size), the '
    f'sequence length or the model, or split it over more devices (config.train.mesh); '
    f'{workdir} keeps its checkpoints: the same command resumes'
  )


def run(config_flag, **options) -> None:
  """`run_or_fail(config_flag, **options)`, with a Ctrl-C outside the training loop (while
  TensorFlow imports, data is prepared or the step compiles: the loop itself saves a
  checkpoint and exits, `train/preemption.py`) one line and exit status 130."""
  try:
    run_or_fail(config_flag, **options)
  except KeyboardInterrupt:
    sys.stderr.write(
      'Interrupted (Ctrl-C); re-run the same command to resume from the newest checkpoint\n'
    )
    sys.exit(130)


def run_or_fail(
  config_flag,
  *,
  workdir: str,
  mode: str,
  restart: bool,
  verbose: bool,
  distributed: Dict[str, Any],
) -> None:
  """Trains and evaluates (`mode='train'`, resuming if it can) or evaluates (`'eval'`) the
  config of `config_flag` (main.py's --config) in `workdir` (None: named after the config);
  any expected failure exits with one line.

  `verbose`: --verbosity was given (absl's INFO lines are kept). `distributed`: the
  arguments of `sharding.initialize_distributed`.
  """
  logs.quiet_logs(verbose)
  try:  # a bad field (a misspelt mechanism, say) is one line before the workdir line
    validate.validate_config(config_flag.value)
  except validate.ConfigError as e:
    sys.exit(f'Invalid config: {e}')
  if not verbose:
    logs.quiet_tensorflow_import()  # tf.data and TFDS load it; its notices go
  config_arg = config_flags.get_config_filename(config_flag)
  overrides = config_flags.get_override_values(config_flag)
  evaluating = mode == 'eval'
  path = workdir or (
    workdir_lib.eval_workdir(config_arg, overrides)
    if evaluating
    else workdir_lib.default_workdir(config_arg, overrides)
  )
  print(f'workdir {path}', flush=True)
  config = config_flag.value
  if evaluating:  # the run's own dataset, unless the command names another
    try:
      config = eval_config(config, workdir_lib.load_config(path), overrides)
    except workdir_lib.WorkdirError as e:  # a damaged config.json: one line
      sys.exit(f'Error: {e}')
  try:
    sharding.initialize_distributed(**distributed)
  except (ValueError, ConnectionError) as e:
    sys.exit(f'Error: {e}')
  try:
    if mode == 'train':
      trainer.train_and_evaluate(config, path, restart=restart)
    else:
      trainer.evaluate(config, path)
  except validate.ConfigError as e:
    sys.exit(f'Invalid config: {e}')
  except (workdir_lib.WorkdirError, checkpoint.CheckpointSaveError) as e:
    sys.exit(f'Error: {e}')
  except FileNotFoundError as e:  # --mode=eval without a checkpoint
    sys.exit(f'Error: {e}')
  except FloatingPointError as e:  # a non-finite loss: the message names the step
    sys.exit(f'Error: {e}')
  except OSError as e:  # a full disk, a read-only workdir: one line naming the path
    message = workdir_lib.write_failure(path, e, training=mode == 'train')
    if message is None:
      raise
    sys.exit(f'Error: {message}')
  except data.DownloadError as e:  # TFDS without a network: how to train from files
    sys.exit(f'Error: {e}{offline_hint(sys.argv, config_arg, config)}')
  except jax.errors.JaxRuntimeError as e:  # out of memory: one line, the rest is XLA's
    message = out_of_memory(e, path)
    if message is None:
      raise
    sys.exit(f'Error: {message}')

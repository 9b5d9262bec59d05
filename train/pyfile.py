"""Definition files (configs, sweeps) loaded by path, with one-line errors.

    get_config = pyfile.function('configs/mnist.py', 'get_config')
    config = get_config('super')
    sweep = pyfile.call('studies/cifar10_mechanisms/sweep.py:seed=1', 'get_sweep')

Every failure is a ValueError naming the file: it does not exist, is not a
`.py` file, raises while loading (the exception's type and message are kept),
or does not define the function; `call` also names an argument the function
does not take or rejects. `config_flag_error` gives the one line of an error
from parsing `--config=path.py[:arg]` and its `--config.<field>=value` flags.
"""

import importlib.util
import inspect
import os
from typing import Any, Callable, Sequence


def function(path: str, name: str) -> Callable[..., Any]:
  """The function `name` defined by the Python file at `path`."""
  if not path.endswith('.py'):
    raise ValueError(f'{path!r} is not a Python file (path.py)')
  if not os.path.isfile(path):
    raise ValueError(f'{path!r} does not exist')
  spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{path!r} does not load: {type(e).__name__}: {e}') from None
  fn = getattr(module, name, None)
  if not callable(fn):
    raise ValueError(f'{path!r} defines no {name}()')
  return fn


def call(spec: str, name: str) -> Any:
  """`name(arg)` of the file of `spec` = 'path.py:arg' (big_vision style), `name()` without ':'.

  The argument is the text after the first ':' (`key=value,...`, parsed by the
  function itself, e.g. with `configs.common.parse_arg`). A ValueError the
  function raises is re-raised as one line naming `spec`.
  """
  path, sep, arg = spec.partition(':')
  fn = function(path, name)
  if sep and not inspect.signature(fn).parameters:
    raise ValueError(f'{path!r} takes no argument; got {arg!r}')
  try:
    return fn(arg) if sep else fn()
  except ValueError as e:
    raise ValueError(f'{spec!r}: {e}') from None


CONFIG_FILE_ERROR = 'Error whilst parsing config file:'


def config_flag_error(error: Exception, argv: Sequence[str]) -> str:
  """One line for an error ml_collections' config flags raised while parsing `argv`.

  An absl flags error (a config file whose get_config raised: its message, without
  the traceback ml_collections wraps around it; a value a field's type refuses) or
  an override of a field that does not exist, e.g. "Invalid config override
  --config.model.num_head: no field 'num_head'; did you mean "num_heads"" (ConfigDict
  raises it as a KeyError, whose text would be an escaped repr); without a close name, the
  valid fields of the group, read from the config file.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top

  if isinstance(error, flags.Error):
    head, sep, trace = str(error).partition(CONFIG_FILE_ERROR)
    lines = trace.strip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File ')]
    if not sep or not frames:
      return ' '.join(str(error).split())
    # After the last frame (its source lines are indented): 'ValueError: message'.
    exception = [line for line in lines[frames[-1] :] if line and not line[0].isspace()]
    return head + ' '.join(exception).split(': ', 1)[-1]
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  lines = (str(error.args[0]) if error.args else type(error).__name__).splitlines()
  name = lines[0].strip('\'"')
  hint = ('; ' + lines[1][0].lower() + lines[1][1:]) if len(lines) > 1 and lines[1] else ''
  flag = next((a.split('=')[0] for a in argv[1:] if a.split('=')[0].endswith(f'.{name}')), '')
  if not hint and flag:
    valid = _fields_beside(flag, argv)
    hint = f'; valid: {", ".join(valid)}' if valid else ''
  return f'Invalid config override {flag}: no field {name!r}{hint}'.replace(' :', ':')


def _fields_beside(flag: str, argv: Sequence[str]) -> Sequence[str]:
  """The fields of the group that `flag` ('--config.model.num_head') overrides, read from
  the config file its '--config=path.py[:arg]' names; () when that cannot be done."""
  prefix, *group = flag.split('.')[:-1]
  spec = next((a.split('=', 1)[1] for a in argv[1:] if a.startswith(f'{prefix}=')), '')
  try:
    node = call(spec, 'get_config')
    for key in group:
      node = node[key]
    return sorted(node.keys())
  except Exception:  # pylint: disable=broad-except  (only a better message is lost)
    return ()

"""Definition files (configs, sweeps) loaded by path, with one-line errors.

    get_config = pyfile.function('configs/mnist.py', 'get_config')
    config = get_config('super')
    sweep = pyfile.call('studies/cifar10_mechanisms/sweep.py:seed=1', 'get_sweep')

Every failure is a ValueError naming the file: it does not exist, is not a
`.py` file, raises while loading (the exception's type and message are kept),
or does not define the function; `call` also names an argument the function
does not take or rejects.
"""
import importlib.util
import inspect
import os
from typing import Any, Callable


def function(path: str, name: str) -> Callable[..., Any]:
  """The function `name` defined by the Python file at `path`."""
  if not path.endswith('.py'):
    raise ValueError(f'{path!r} is not a Python file (path.py)')
  if not os.path.isfile(path):
    raise ValueError(f'{path!r} does not exist')
  spec = importlib.util.spec_from_file_location(
      os.path.splitext(os.path.basename(path))[0], path)
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

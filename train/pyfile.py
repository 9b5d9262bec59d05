"""Definition files (configs, sweeps) loaded by path, with one-line errors.

    get_config = pyfile.function('configs/mnist.py', 'get_config')
    config = get_config('super')

Every failure is a ValueError naming the file: it does not exist, is not a
`.py` file, raises while loading (the exception's type and message are kept),
or does not define the function.
"""
import importlib.util
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

"""Checks on traced values: a clear error where a static check cannot see the data.

    checks.runtime_check(index < capacity, 'decoding step {} past the cache', index)

Outside a trace the condition is concrete and a ValueError is raised at once.
Inside `jit`/`scan` the value exists only when the compiled computation runs,
after every line of Python has returned, so the check is sent to the host with
`jax.debug.callback` and a failing one raises there: the computation stops
with the message instead of returning a quietly wrong value. JAX reports an
exception raised in a host callback as a `JaxRuntimeError` whose text begins
'INTERNAL: CpuCallback error calling callback: Traceback ...' (the wording is
JAX's and no library code runs between the callback and the caller to reword
it); its last line is the ValueError, one line, which `TRACED` marks so it is
read as ours: the check, not JAX, failed.
"""

import jax
import numpy as np

# Appended to a traced check's message: says where it ran and what to read.
TRACED = (
  ' [checked when the jitted computation ran, since the value was traced; JAX '
  'wraps this ValueError in its CpuCallback error]'
)


def _raise_if_false(ok, message: str, *values) -> None:
  if not bool(np.all(ok)):
    raise ValueError(message.format(*(np.asarray(v).tolist() for v in values)))


def runtime_check(ok, message: str, *values) -> None:
  """Raises ValueError(message.format(*values)) unless `ok` (a bool, or a traced bool) holds.

  A traced condition raises when the computation runs, its message ending in `TRACED`.
  """
  if not isinstance(ok, jax.core.Tracer) and not any(
    isinstance(v, jax.core.Tracer) for v in values
  ):
    _raise_if_false(ok, message, *values)
    return
  jax.debug.callback(_raise_if_false, ok, message + TRACED, *values)

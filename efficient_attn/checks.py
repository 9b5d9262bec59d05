"""Checks on traced values: a clear error where a static check cannot see the data.

    checks.runtime_check(index < capacity, 'decoding step {} past the cache', index)

Outside a trace the condition is concrete and a ValueError is raised at once.
Inside `jit`/`scan` the condition is sent to the host with `jax.debug.callback`
and a failing one raises there, so the computation stops with the message
(wrapped in a JaxRuntimeError) instead of returning a quietly wrong value.
"""
import jax
import numpy as np


def _raise_if_false(ok, message: str, *values) -> None:
  if not bool(np.all(ok)):
    raise ValueError(message.format(*(np.asarray(v).tolist() for v in values)))


def runtime_check(ok, message: str, *values) -> None:
  """Raises ValueError(message.format(*values)) unless `ok` (a bool, or a traced bool) holds."""
  if not isinstance(ok, jax.core.Tracer) and not any(
      isinstance(v, jax.core.Tracer) for v in values):
    _raise_if_false(ok, message, *values)
    return
  jax.debug.callback(_raise_if_false, ok, message, *values)

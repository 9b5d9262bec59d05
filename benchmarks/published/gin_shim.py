"""A stand-in for `gin` (gin-config), ours, for running published code that only registers with it.

google-research's `performer/fast_attention/jax/fast_attention.py` imports gin to
mark functions configurable (`gin.configurable`, `gin.external_configurable`) and
uses nothing else of it. Where gin-config is not installed, `install()` puts this
module in `sys.modules['gin']` so that file imports unchanged; both decorators
return what they are given. Nothing here touches the published file.
"""

import sys
import types


def configurable(fn_or_name=None, *args, **kwargs):
  """`@gin.configurable` or `@gin.configurable('name', ...)`: the function, unchanged."""
  del args, kwargs
  if callable(fn_or_name):
    return fn_or_name
  return lambda fn: fn


def external_configurable(fn, *args, **kwargs):
  """`gin.external_configurable(fn, name)`: fn, unchanged."""
  del args, kwargs
  return fn


def install() -> bool:
  """Makes `import gin` work: True if this stand-in was installed, False if gin was there."""
  try:
    import gin  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    return False
  except ImportError:
    module = types.ModuleType('gin')
    module.configurable = configurable
    module.external_configurable = external_configurable
    module.__doc__ = __doc__
    sys.modules['gin'] = module
    return True

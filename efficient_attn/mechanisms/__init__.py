"""Attention mechanisms: one file each, pure functions plus a registered declaration.

Every module of this package is imported by `efficient_attn.registry` and
registers its mechanisms there. Their pure functions are also reachable here
by name, the decoding steps of the recurrent ones too:

    from efficient_attn import mechanisms
    out = mechanisms.nystrom_attention(q, k, v, num_landmarks=16)
    state, out_t = mechanisms.linear_attention_step(state, q_t, k_t, v_t)
"""
import importlib
import pkgutil


def _modules():
  for info in pkgutil.iter_modules(__path__):
    yield importlib.import_module(f'{__name__}.{info.name}')


def _functions():
  """{name: function} of every public `*_attention`, `*_attention_step` and `*_mixing`
  function of the package."""
  out = {}
  for module in _modules():
    for name, value in vars(module).items():
      if (name.endswith(('_attention', '_attention_step', '_mixing'))
          and not name.startswith('_')
          and callable(value) and getattr(value, '__module__', '') == module.__name__):
        out[name] = value
  return out


def __getattr__(name):
  if name in {info.name for info in pkgutil.iter_modules(__path__)}:  # a submodule
    return importlib.import_module(f'{__name__}.{name}')
  functions = _functions()
  if name in functions:
    return functions[name]
  raise AttributeError(f'efficient_attn.mechanisms has no {name!r}; functions: '
                       f'{", ".join(sorted(functions))}')


def __dir__():
  return sorted(_functions())

"""Pure attention functions on `[batch, length, heads, head_dim]` arrays.

One submodule per family (`softmax`, `linear`, `random_features`, `linformer`,
`nystrom`, `local`); each registered mechanism's pure function is also reachable
here by its function name, loaded on first use:

    from efficient_attn import mechanisms
    out = mechanisms.nystrom_attention(q, k, v, num_landmarks=16)
"""
from efficient_attn import registry

_FUNCTIONS = {spec.fn_path.split(':')[1]: spec for spec in registry.MECHANISMS.values()}


def __getattr__(name):
  if name in _FUNCTIONS:
    return _FUNCTIONS[name].fn
  raise AttributeError(f'efficient_attn.mechanisms has no {name!r}; functions: '
                       f'{", ".join(_FUNCTIONS)}')


def __dir__():
  return sorted(_FUNCTIONS)

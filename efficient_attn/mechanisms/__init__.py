"""Attention mechanisms: one file each, pure functions plus a registered declaration.

Every module of this package is imported by `efficient_attn.registry` and
registers its mechanisms there. Their pure functions are also reachable here
by name, the decoding steps of the recurrent ones too:

    from efficient_attn import mechanisms
    out = mechanisms.nystrom_attention(q, k, v, num_landmarks=16)
    out = mechanisms.gla_attention(q, k, v, log_decay)     # a gated recurrence alone
    state, out_t = mechanisms.linear_attention_step(state, q_t, k_t, v_t)
    mechanisms.pure_function('gated_deltanet')              # delta_rule_attention

Each registered family has one: `<family>_attention`, or the name in `FUNCTIONS`.
"""
import importlib
import pkgutil

#: The pure function of each mechanism family not named `<family>_attention` (and
#: softmax's, which lives in `efficient_attn.softmax` and is re-exported here).
FUNCTIONS = {
    'softmax': 'softmax_attention',
    'softmax_chunked': 'chunked_softmax_attention',
    'fnet': 'fnet_mixing',
    'gmlp': 'spatial_gating',
    'mixer': 'token_mixing',
    'deltanet': 'delta_rule_attention',
    'gated_deltanet': 'delta_rule_attention',
}


def _modules():
  for info in pkgutil.iter_modules(__path__):
    yield importlib.import_module(f'{__name__}.{info.name}')


def _functions():
  """{name: function} of every public `*_attention`, `*_attention_step` and `*_mixing`
  function of the package."""
  out = {}
  named = set(FUNCTIONS.values())
  for module in _modules():
    for name, value in vars(module).items():
      if not callable(value) or name.startswith('_'):
        continue
      if name in named or (name.endswith(('_attention', '_attention_step', '_mixing'))
                           and getattr(value, '__module__', '') == module.__name__):
        out[name] = value
  return out


def pure_function(mechanism: str):
  """The pure function of the registered mechanism family `mechanism` (e.g. 'gla' ->
  `gla_attention`); ValueError naming the valid choices."""
  from efficient_attn import registry  # pylint: disable=g-import-not-at-top
  if mechanism not in registry.list_mechanisms():
    raise ValueError(f'mechanism {mechanism!r} is not registered; valid choices: '
                     f'{", ".join(registry.list_mechanisms())}')
  return _functions()[FUNCTIONS.get(mechanism, f'{mechanism}_attention')]


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

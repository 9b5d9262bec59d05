"""Attention mechanisms declare themselves here, once, each in its own file.

    from efficient_attn import registry

    @registry.register
    class Nystrom(registry.Mechanism):
      name = 'nystrom'
      description = 'Nystrom landmarks and an iterative pseudo-inverse'
      citation = 'Xiong et al. 2021'
      options = (registry.Option('num_landmarks', 32, int, 'landmarks m', minimum=1), ...)
      complexity = ('O(n m d + m^3)', 'O(n m)')
      knob = ('num_landmarks', (8, 16, 32, 64, 128, 256, 'n'))

      def attend(self, options, params, q, k, v, *, mask, causal, ctx):
        return nystrom_attention(q, k, v, options.num_landmarks, mask=mask, ...)

The declarations' classes live in `efficient_attn.declaration` and are importable from
here (`registry.Mechanism`, `registry.Option`, `registry.ParamSpec`, ...); this module
keeps the table of registered declarations and its look-ups. Everything else reads
them: the Linen and NNX layers build the declared parameters and call `attend`; the
config validator and the layers check options with the same `Option`s; decoding reads
`decode`; the benchmark and docs tables read `complexity` and `knob`; the tests loop
over the registry with each mechanism's `example` options. Adding a mechanism is one
file in `efficient_attn/mechanisms/` (imported by name in its `__init__.py`) plus its test.
"""

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from efficient_attn.declaration import DECODE_FORMS
from efficient_attn.declaration import MASKS
from efficient_attn.declaration import ROTARY_FORMS
from efficient_attn.declaration import SEQUENCE_FORMS
from efficient_attn.declaration import Context
from efficient_attn.declaration import Mechanism
from efficient_attn.declaration import Option
from efficient_attn.declaration import Options
from efficient_attn.declaration import ParamSpec

__all__ = [
  'DECODE_FORMS',
  'MASKS',
  'PROJECTIONS',
  'ROTARY_FORMS',
  'SEQUENCE_FORMS',
  'Context',
  'Mechanism',
  'Option',
  'Options',
  'ParamSpec',
  'check_arguments',
  'check_length',
  'check_projection',
  'configure',
  'declaration',
  'get_mechanism',
  'list_mechanisms',
  'list_projections',
  'mechanisms',
  'names_where',
  'option_table',
  'register',
]

PROJECTIONS: Tuple[str, ...] = ('standard', 'optimised', 'efficient', 'super')
_MECHANISMS: Dict[str, Mechanism] = {}
_REGISTERED: List[str] = []  # names in the order they registered
_SOFTMAX_MODULE = 'efficient_attn.mechanisms.softmax'


def _rank(decl: Mechanism) -> Tuple[bool, str, int]:
  module = type(decl).__module__
  return (module != _SOFTMAX_MODULE, module, _REGISTERED.index(decl.name))


def register(cls):
  """Class decorator: registers one instance of a `Mechanism` subclass under `cls.name`."""
  decl = cls()
  if not decl.name or decl.name in _MECHANISMS:
    raise ValueError(f'mechanism name {decl.name!r} is empty or registered twice')
  if (
    decl.masks not in MASKS
    or decl.decode not in DECODE_FORMS
    or decl.rotary not in ROTARY_FORMS
    or decl.sequence_parallel not in SEQUENCE_FORMS
  ):
    raise ValueError(
      f'mechanism {decl.name!r}: masks must be one of {MASKS}, decode one of '
      f'{DECODE_FORMS}, rotary one of {ROTARY_FORMS}, sequence_parallel one '
      f'of {SEQUENCE_FORMS}'
    )
  if decl.causal_only and not decl.causal:
    raise ValueError(f'mechanism {decl.name!r} is causal_only, so it must declare causal')
  decl.resolve()  # the defaults themselves must be valid
  _MECHANISMS[decl.name] = decl
  _REGISTERED.append(decl.name)
  # The same order whatever was imported first: softmax's module, then by module name,
  # then as registered within a module.
  ordered = sorted(_MECHANISMS.values(), key=_rank)
  _MECHANISMS.clear()
  _MECHANISMS.update((d.name, d) for d in ordered)
  return cls


def list_mechanisms() -> Tuple[str, ...]:
  """Every registered mechanism name ('softmax' first, then by module)."""
  return tuple(_MECHANISMS)


def mechanisms() -> Tuple[Mechanism, ...]:
  """Every registered declaration, in `list_mechanisms` order."""
  return tuple(_MECHANISMS.values())


def get_mechanism(name: str) -> Mechanism:
  """The declaration registered as `name`; ValueError lists the valid names."""
  if name not in _MECHANISMS:
    stack = (
      " (a pattern 'a+b' names the mechanisms a stack's blocks take in turn: "
      "TransformerConfig, efficient_attn.layers.hybrid; a layer takes one)"
      if '+' in str(name)
      else ''
    )
    raise ValueError(
      f'Unknown attention mechanism {name!r}{stack}; valid mechanisms: {", ".join(_MECHANISMS)}'
    )
  return _MECHANISMS[name]


def declaration(mechanism: Union[str, Mechanism]) -> Mechanism:
  """The declaration of `mechanism`, a registered name (looked up) or a declaration (itself).

  So a caller that resolved the mechanism once passes the declaration down, and
  nothing below it looks the name up again.
  """
  return mechanism if isinstance(mechanism, Mechanism) else get_mechanism(mechanism)


def check_arguments(mechanism: str, function: str, **values) -> None:
  """Checks a pure function's keyword `values` against `mechanism`'s declared Options.

  So a bound is written once, in its `Option`, and both the layer (through
  `configure`) and the mechanism's plain function enforce it. Only the range is
  checked (choices, bounds, None where allowed), not the type: a plain function
  takes what it took before (e.g. a NumPy int).

  Raises:
    ValueError: one line naming the function, the value and what is allowed, e.g.
      "sinkhorn_attention: temperature=0.0 is not valid; it must be a finite float > 0.0".
  """
  decl = _MECHANISMS.get(mechanism) or get_mechanism(mechanism)  # registered on import
  declared = {option.name: option for option in decl.options}
  for name, value in values.items():
    option = declared[name]
    if (not option.allow_none) if value is None else option.out_of_range(value):
      raise ValueError(f'{function}: {name}={value!r} is not valid; it must be {option.describe()}')


def names_where(predicate: Callable[[Mechanism], bool]) -> Tuple[str, ...]:
  """The names of the mechanisms whose declaration satisfies `predicate`."""
  return tuple(m.name for m in mechanisms() if predicate(m))


def configure(
  mechanism: Union[str, Mechanism],
  options: Optional[Mapping[str, Any]] = None,
  *,
  causal: bool = False,
  max_length: Optional[int] = None,
  length: Optional[int] = None,
  rotary: bool = False,
) -> Tuple[Mechanism, Options]:
  """(declaration, resolved options) after every check that needs no data.

  `mechanism` is a registered name or its declaration (`declaration`): a layer
  that receives the declaration does not look the name up again.

  Raises ValueError, naming the value and what is valid, for an unknown
  mechanism or option, an option value out of range, `causal` for a
  mechanism without a causal form (and not `causal` for a causal-only one), a fixed-length
  mechanism without
  `max_length`, a `length` over `max_length`, `rotary` for a mechanism without
  q . k scores, and the mechanism's own checks.
  """
  decl = declaration(mechanism)
  mechanism = decl.name
  resolved = decl.resolve(options)
  if causal and not decl.causal:
    raise ValueError(
      f'mechanism {mechanism!r} has no causal form (it mixes information along the '
      f'sequence before scoring, which would let a token see the future); mechanisms '
      f'with a causal form: {", ".join(names_where(lambda m: m.causal))}'
    )
  if rotary and not decl.rotary:
    raise ValueError(
      f'mechanism {mechanism!r} cannot take rotary positions (rotary=True): it has no '
      f'query-key scores to rotate; mechanisms that can: '
      f'{", ".join(names_where(lambda m: bool(m.rotary)))}'
    )
  if decl.causal_only and not causal:
    raise ValueError(
      f'mechanism {mechanism!r} is causal only (defined along the sequence, with no '
      f'bidirectional form): build it with causal=True; mechanisms with a bidirectional '
      f'form: {", ".join(names_where(lambda m: not m.causal_only))}'
    )
  if decl.fixed_length and max_length is None:
    raise ValueError(
      f'mechanism {mechanism!r} has length-shaped parameters and needs '
      f'max_length (the longest sequence it will see)'
    )
  if length is not None:
    check_length(decl, resolved, length=length, max_length=max_length, causal=causal)
  return decl, resolved


def check_length(
  decl: Mechanism, options: Options, *, length: int, max_length: Optional[int], causal: bool
) -> None:
  """The checks of `configure` that need the sequence length, on a configured (decl, o):
  a fixed-length mechanism's `length` over `max_length`, and the mechanism's own
  `check`. ValueError naming the length and the limit."""
  if max_length is not None and decl.fixed_length and length > max_length:
    raise ValueError(
      f'sequence length {length} exceeds max_length={max_length} that '
      f'mechanism {decl.name!r} is built for'
    )
  decl.check(options, length=length, max_length=max_length, causal=causal)


def list_projections() -> Tuple[str, ...]:
  """The projection schemes' names: ('standard', 'optimised', 'efficient', 'super')."""
  return PROJECTIONS


def check_projection(name: str) -> str:
  if name not in PROJECTIONS:
    raise ValueError(
      f'Unknown projection scheme {name!r}; valid projections: {", ".join(PROJECTIONS)}'
    )
  return name


def option_table() -> Dict[str, Option]:
  """Every option name of every mechanism -> one `Option` of that name (for configs).

  Options of the same name must have the same type across mechanisms (a
  config field has one type); ValueError names any that do not.
  """
  table: Dict[str, Option] = {}
  for decl in mechanisms():
    for opt in decl.options:
      if not opt.configurable:
        continue
      other = table.setdefault(opt.name, opt)
      if other.type is not opt.type:
        raise ValueError(
          f'option {opt.name!r} is {other.type.__name__} in one mechanism and '
          f'{opt.type.__name__} in {decl.name!r}; one name, one type'
        )
  return table

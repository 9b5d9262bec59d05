"""Stacks whose blocks take mechanisms in turn: 'linear+local'.

A stack's mechanism may be a pattern, registered names joined by '+': the blocks
take them in turn, repeated over the depth ('linear+local' at depth 4: linear,
local, linear, local). So the hybrids of recent models compose from the
registry: Based (Arora et al. 2024: Taylor linear attention with sliding-window
attention), Griffin (De et al. 2024: recurrences with local attention) or
Jamba's attention-in-a-few-layers (Lieber et al. 2024, 'mamba2+softmax' and
the like). The stack's options are one mapping: each block gets the options its
mechanism declares; an option that no block's mechanism declares is refused.

    hybrid.names('linear+local')          # ('linear', 'local')
    layers = hybrid.configure('linear+local', {'feature_map': 'taylor', 'window': 64},
                              causal=True, max_length=256)
    # ((linear's declaration, its options), (local's, its options)): one per
    # entry of the pattern; block i takes layers[i % len(layers)]
    stack = hybrid.Stack(layers)          # the same, configured once: a model's mechanism
    stack.options                         # one mapping for them all (merged_options)

A single mechanism is the pattern of one name, and everything here reduces to
`registry.configure` for it.
"""

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from efficient_attn import registry

SEPARATOR = '+'
Layers = Tuple[Tuple[registry.Mechanism, registry.Options], ...]


@dataclasses.dataclass(frozen=True)
class Stack:
  """A stack's mechanisms configured once: `layers`, one (declaration, options) per entry
  of the pattern, as `configure` gives them; block i takes layers[i % len(layers)].

  A model handed a Stack as its mechanism (`TransformerConfig.mechanism`) gives its blocks
  these, configuring nothing again: a trainer that configured them under its own checks
  (`train/attention.py`) hands them down so."""

  layers: Layers

  @property
  def declarations(self) -> Tuple[registry.Mechanism, ...]:
    return tuple(decl for decl, _ in self.layers)

  @property
  def options(self) -> registry.Options:
    """The layers' options as one mapping (`merged_options`)."""
    return merged_options(self.layers)


Mechanisms = Union[str, registry.Mechanism, Stack, Sequence[Union[str, registry.Mechanism]]]


def declarations(mechanism: Mechanisms) -> Tuple[registry.Mechanism, ...]:
  """The declarations of a pattern ('linear+local'), a name, a declaration, a `Stack`, or a
  sequence of names or declarations, in block order. ValueError names a part that is not
  registered."""
  if isinstance(mechanism, registry.Mechanism):
    return (mechanism,)
  if isinstance(mechanism, Stack):
    return mechanism.declarations
  parts: List[Union[str, registry.Mechanism]] = (
    list(mechanism.split(SEPARATOR)) if isinstance(mechanism, str) else list(mechanism)
  )
  if not parts or any(p == '' for p in parts):
    raise ValueError(
      f'mechanism {mechanism!r} is not valid: a pattern names registered '
      f"mechanisms joined by {SEPARATOR!r}, e.g. 'linear{SEPARATOR}local'"
    )
  return tuple(registry.declaration(p) for p in parts)


def unregistered(mechanism: str) -> Tuple[str, ...]:
  """The names of the pattern `mechanism` that are not registered ('' for an empty one)."""
  known = registry.list_mechanisms()
  return tuple(p for p in mechanism.split(SEPARATOR) if p not in known)


def registered(mechanism: str) -> Tuple[registry.Mechanism, ...]:
  """The declarations of the pattern's registered names (the others left to a check that
  names them, `unregistered`)."""
  known = registry.list_mechanisms()
  return tuple(registry.get_mechanism(p) for p in mechanism.split(SEPARATOR) if p in known)


def names(mechanism: Mechanisms) -> Tuple[str, ...]:
  """The mechanism names of the pattern, in block order."""
  return tuple(d.name for d in declarations(mechanism))


def name(mechanism: Mechanisms) -> str:
  """The pattern as one string: 'linear+local' (a single mechanism: its name)."""
  return SEPARATOR.join(names(mechanism))


def option_defaults(mechanism: Mechanisms) -> Dict[str, Tuple[Any, ...]]:
  """{option: the declared defaults of the pattern's mechanisms that have it}: one default
  for an option one mechanism declares, more where two declare it with their own."""
  defaults: Dict[str, Tuple[Any, ...]] = {}
  for decl in dict.fromkeys(declarations(mechanism)):
    for option in decl.options:
      defaults[option.name] = defaults.get(option.name, ()) + (option.default,)
  return defaults


def off_defaults(mechanism: Mechanisms, options: Mapping[str, Any]) -> Dict[str, Any]:
  """The `options` that change the model of `mechanism`'s stack: those not at the default
  of every mechanism of the pattern that declares them, and those none declares. So two
  stacks named by these (a run's name, a report's row) are the same model: 'gla+deltanet'
  with conv_size=0 is named, since DeltaNet's default is 4, and GLA's 0."""
  defaults = option_defaults(mechanism)
  return {k: v for k, v in options.items() if k not in defaults or any(d != v for d in defaults[k])}


def split_options(
  mechanism: Mechanisms, options: Optional[Mapping[str, Any]]
) -> Tuple[Dict[str, Any], ...]:
  """`options` shared out: per entry of the pattern, the ones its mechanism declares.

  A single mechanism gets `options` whole (its own checks name an unknown one). ValueError
  names an option that no mechanism of a pattern declares, and the ones they do."""
  decls = declarations(mechanism)
  options = dict(options or {})
  if len(decls) == 1:
    return (options,)
  declared = [{option.name for option in d.options} for d in decls]
  unknown = sorted(set(options) - set().union(*declared))
  if unknown:
    valid = sorted(set().union(*declared))
    raise ValueError(
      f'option{"s" if len(unknown) > 1 else ""} '
      f'{", ".join(map(repr, unknown))} {"are" if len(unknown) > 1 else "is"} '
      f'not an option of any mechanism of {name(decls)!r}; their options: '
      f'{", ".join(valid) or "none"}'
    )
  return tuple({k: v for k, v in options.items() if k in own} for own in declared)


def entries(
  mechanism: Mechanisms, options: Optional[Mapping[str, Any]]
) -> Tuple[Tuple[registry.Mechanism, Dict[str, Any]], ...]:
  """Per entry of the pattern, (declaration, the `options` it declares: `split_options`)."""
  decls = declarations(mechanism)
  return tuple(zip(decls, split_options(decls, options)))


def resolve(mechanism: Mechanisms, options: Optional[Mapping[str, Any]] = None) -> Layers:
  """Per entry of the pattern, (declaration, its options resolved: declared defaults plus
  what `options` set), without the checks that need the model (see `configure`)."""
  return tuple((decl, decl.resolve(own)) for decl, own in entries(mechanism, options))


def configure(
  mechanism: Mechanisms,
  options: Optional[Mapping[str, Any]] = None,
  *,
  causal: bool = False,
  max_length: Optional[int] = None,
  length: Optional[int] = None,
  rotary: bool = False,
) -> Layers:
  """`registry.configure` for each entry of the pattern: ((declaration, options), ...).

  `causal` is the stack's: a causal-only mechanism (e.g. 'gla') is causal whatever it
  says, as in a single-mechanism stack. Raises ValueError as `registry.configure` does
  (for a pattern, naming the mechanism), or for an option no mechanism declares."""
  return tuple(
    registry.configure(
      decl,
      own,
      causal=causal or decl.causal_only,
      max_length=max_length,
      length=length,
      rotary=rotary,
    )
    for decl, own in entries(mechanism, options)
  )


def stack(
  mechanism: Mechanisms,
  options: Optional[Mapping[str, Any]] = None,
  *,
  causal: bool = False,
  max_length: Optional[int] = None,
) -> Stack:
  """`mechanism`, a `Stack` already, as it is; else its `Stack`, configured (`configure`)."""
  if isinstance(mechanism, Stack):
    return mechanism
  return Stack(configure(mechanism, options, causal=causal, max_length=max_length))


def merged_options(
  layers: Sequence[Tuple[registry.Mechanism, Mapping[str, Any]]],
) -> registry.Options:
  """One options mapping for `layers` ((declaration, options) per entry, as `configure`
  gives): each option at the value every entry that has it agrees on. An option on which
  they differ (two mechanisms' own defaults) is left out, so that resolving the mapping
  again (`resolve`, `configure`: declared defaults for what it lacks) gives each entry its
  own value back. A reader of the mapping (a config.json) finds no such option in it."""
  merged: Dict[str, Any] = {}
  differ = set()
  for _, options in layers:
    for k, v in options.items():
      if k in merged and merged[k] != v:
        differ.add(k)
      merged.setdefault(k, v)
  return registry.Options({k: v for k, v in merged.items() if k not in differ})


def check_depth(mechanism: Mechanisms, depth: int) -> None:
  """ValueError unless the pattern's length divides `depth` (every entry repeats alike)."""
  n = len(declarations(mechanism))
  if depth % n:
    valid = [d for d in range(n, 4 * n + 1, n)]
    raise ValueError(
      f'mechanism {name(mechanism)!r} gives blocks {n} mechanisms in turn, '
      f'which does not divide depth={depth}; valid depths: multiples of {n} '
      f'({", ".join(map(str, valid))}, ...)'
    )

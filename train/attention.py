"""`config.attention` resolved once, into the value the rest of the trainer reads.

    attention = attention.resolve(config, length=197, context=197)  # ConfigError, one line
    attention.stack            # hybrid.Stack: (declaration, options) per entry of the pattern
    attention.mechanism        # the declaration (a tuple of them for 'linear+local')
    attention.options          # their options, declared defaults filled in (merged)

`resolve` is the attention's one check: the mechanism's name or pattern, the
projection, the options, key/value heads, the causal form, the lengths the model is
built for (`modeling.ModelInputs`, which `modeling.check` resolves first), rotary
positions, pooling, the pattern's depth and the reversible stack, each mechanism
configured once (`registry.configure`). What it returns is handed down: the model
builds its attention layers from it (`modeling.create_model`, configuring nothing
again), and the samples' check (`train/validate.py`) and the sequence split's
(`train/trainer.py`) read which mechanisms decode and which split the sequence.
"""

import dataclasses
from typing import Any, Dict, Optional, Tuple

from configs import fields
from efficient_attn import registry
from efficient_attn.layers import head_shapes
from efficient_attn.layers import hybrid

PROJECTION = fields.Field('attention.projection', choices=registry.list_projections())


@dataclasses.dataclass(frozen=True)
class Attention:
  """`config.attention`, resolved (`resolve`).

  Attributes:
    stack: the mechanisms configured for this model, one (declaration, options) per
      entry of the pattern (`hybrid.Stack`; one entry for a single mechanism).
    projection: the projection scheme ('standard', 'efficient', 'super', ...).
    num_kv_heads: key/value heads (grouped-query attention); None: one per head.
    rotary: rotary positions in every attention layer.
  """

  stack: hybrid.Stack
  projection: str
  num_kv_heads: Optional[int]
  rotary: bool

  @property
  def declarations(self) -> Tuple[registry.Mechanism, ...]:
    return self.stack.declarations

  @property
  def mechanism(self) -> hybrid.Mechanisms:
    """The declaration, or for a pattern the tuple of them, in block order."""
    declarations = self.declarations
    return declarations[0] if len(declarations) == 1 else declarations

  @property
  def options(self) -> registry.Options:
    """The complete options (for a pattern, `hybrid.merged_options`)."""
    return self.stack.options

  @property
  def name(self) -> str:
    """'linear+local' for a pattern; else the mechanism's name."""
    return hybrid.name(self.declarations)

  @property
  def without_decoding(self) -> Tuple[str, ...]:
    """The names of its mechanisms that have no decoding form (a sampler needs one)."""
    return tuple(decl.name for decl in self.declarations if not decl.decode)

  @property
  def whole_sequence(self) -> Tuple[registry.Mechanism, ...]:
    """Its mechanisms that cannot split the sequence over devices."""
    return tuple(decl for decl in self.declarations if not decl.sequence_parallel)


def resolve(config, *, length: int, context: int) -> Attention:
  """The mechanism of `config.attention`, looked up once and configured for this model
  (the registry's own checks: options, causal form, lengths, rotary) with the settings
  the layers take. A pattern ('linear+local', blocks taking mechanisms in turn; see
  `efficient_attn.layers.hybrid`) shares its options out, each mechanism checked as a
  single one is. `length`: the tokens the attention sees; `context`: the context length
  the model is built for (`modeling.ModelInputs`). ConfigError naming the field, value
  and valid choices."""
  settings = config.attention
  declarations = _declarations(settings.mechanism)
  fields.check(config, (PROJECTION,))
  try:
    entries = hybrid.entries(declarations, config_options(config))
    if config.model.kind == 'mlp':  # no attention layer: only the options are resolved
      return _attention(config, tuple((decl, decl.resolve(own)) for decl, own in entries))
  except ValueError as e:
    raise fields.ConfigError(f'config.attention: {e}') from None
  if len(declarations) > 1:
    _check_pattern(config, declarations)
  return _attention(
    config,
    tuple((decl, _configure(config, decl, own, length, context)) for decl, own in entries),
  )


def config_options(config) -> Dict[str, Any]:
  """The options set in `config.attention.options` (None entries mean 'the default')."""
  options = config.attention.options
  options = options.to_dict() if hasattr(options, 'to_dict') else dict(options or {})
  return {k: v for k, v in options.items() if v is not None}


def _attention(config, layers: hybrid.Layers) -> Attention:
  settings = config.attention
  return Attention(
    stack=hybrid.Stack(layers),
    projection=settings.projection,
    num_kv_heads=settings.get('num_kv_heads') or None,
    rotary=settings.get('rotary', False),
  )


def _declarations(mechanism) -> Tuple[registry.Mechanism, ...]:
  """config.attention.mechanism's declarations: one name, or a pattern 'a+b'."""
  bad = hybrid.unregistered(mechanism) if isinstance(mechanism, str) else (mechanism,)
  if bad:
    what = (
      ''
      if list(bad) == [mechanism]
      else ' (an empty name)'
      if bad[0] == ''
      else f' ({bad[0]!r} is not a mechanism)'
    )
    raise fields.ConfigError(
      f'config.attention.mechanism={mechanism!r} is not valid{what}; valid choices: '
      f'{", ".join(registry.list_mechanisms())}, or several joined by '
      f"{hybrid.SEPARATOR!r}, taken by the blocks in turn (e.g. "
      f"'linear{hybrid.SEPARATOR}local')"
    )
  return hybrid.declarations(mechanism)


def _check_pattern(config, declarations) -> None:
  """The rules of a pattern: its length divides the depth; reversible with one mechanism."""
  model = config.model
  try:
    hybrid.check_depth(declarations, model.depth)
  except ValueError as e:
    raise fields.ConfigError(f'config.model.depth={model.depth}: {e}') from None
  if model.get('reversible', False) and len(set(declarations)) > 1:
    raise fields.ConfigError(
      f'config.model.reversible=True with mechanism {config.attention.mechanism!r}: '
      f'the reversible stack takes one mechanism; valid: '
      f'reversible=False'
    )


def _configure(
  config, decl: registry.Mechanism, own: Dict[str, Any], length: int, context: int
) -> registry.Options:
  """`decl`, a mechanism of config.attention, configured for this model with the options
  `own` that config.attention.options sets for it: its resolved options."""
  settings, model = config.attention, config.model
  name = decl.name  # the block's mechanism (the whole pattern is config.attention.mechanism)
  num_kv_heads = settings.get('num_kv_heads', 0)
  if num_kv_heads:  # 0: one key/value head per head
    try:
      head_shapes.kv_heads(decl, settings.projection, model.num_heads, num_kv_heads)
    except ValueError as e:
      raise fields.ConfigError(f'config.attention.num_kv_heads={num_kv_heads}: {e}') from None
  if (decl.fixed_length or settings.projection == 'super') and length > context:
    what = f'mechanism {name!r}' if decl.fixed_length else "projection 'super'"
    raise fields.ConfigError(
      f'sequence length {length} (config.dataset.max_length={config.dataset.max_length}) '
      f'exceeds the fixed context length {context} that {what} is built for '
      f'(config.model.max_length={model.max_length}); valid: lengths <= {context}'
    )
  causal = model.kind == 'causal'
  if decl.causal_only and model.get('pool') == 'cls' and not causal:  # the causal model: no pool
    raise fields.ConfigError(
      f'config.model.pool=\'cls\' with mechanism {name!r}: a '
      f'causal-only mechanism lets the class token (the first) see '
      f'only itself; valid: pool=\'mean\''
    )
  try:
    decl, options = registry.configure(
      decl,
      own,
      causal=causal or decl.causal_only,
      max_length=context,
      length=length,
      rotary=settings.get('rotary', False),
    )
    head_shapes.head_layout(  # the head shapes the mechanism's options declare, for this scheme
      decl,
      options,
      projection=settings.projection,
      heads=model.num_heads,
      head_dim=model.d_model // model.num_heads,
      kv_heads=head_shapes.kv_heads(
        decl, settings.projection, model.num_heads, num_kv_heads or None
      ),
    )
    return options
  except ValueError as e:
    if causal and not decl.causal:
      valid = registry.names_where(lambda mechanism: mechanism.causal)
      what = 'it has' if name == settings.mechanism else f'its mechanism {name!r} has'
      raise fields.ConfigError(
        f'config.attention.mechanism={settings.mechanism!r} is not valid for '
        f'the causal model kind {model.kind!r}: {what} no '
        f'causal form; valid choices: {", ".join(valid)}'
      ) from None
    raise fields.ConfigError(f'config.attention: {e}') from None

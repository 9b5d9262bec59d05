"""Builds the model `config.model.kind` names, straight from the config.

    model = models.create_model(config)            # ViT, TextClassifier, CausalTransformer, MLP
    x = models.dummy_inputs(config, batch_size=2)   # what model(x, train=...) takes

The trainer, which has resolved the config once (`validate.resolve`), also hands
these its `data.Dataset` and the mechanism's declaration, so that nothing here
looks them up again.

Kinds: 'vit' (images), 'text' (byte or token sequences; a dual encoder for
pairs of documents), 'causal' (pixel tokens, the autoregressive pixel model;
token sequences labelled at each position, e.g. MQAR) and 'mlp' (images, the
LoRA study's base). With `config.lora.rank > 0` the model comes wrapped in
`lora.Adapted` (see `train/adapters.py`).
"""

from typing import Any, Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from configs import fields
import data
from efficient_attn import models as ea
from efficient_attn import registry
from efficient_attn.layers import hybrid
from efficient_attn.layers import multi_head
from train import adapters

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
KINDS = ('vit', 'text', 'causal', 'mlp')
# What each kind reads (`data.input_kind`) and the tasks it serves.
READS = {
  'vit': ('image',),
  'text': ('text', 'text_pair', 'tokens', 'pixels'),
  'causal': ('pixels', 'sequence'),
  'mlp': ('image',),
}
TASKS = {
  'vit': ('classification',),
  'text': ('classification',),
  'causal': ('pixel_lm', 'sequence_labelling', 'byte_lm'),
  'mlp': ('classification',),
}
PIXEL_LEVELS = 256  # causal pixel model: tokens 0..255, start token 256
REVERSIBLE_KINDS = ('vit', 'text')  # encoders; the causal model decodes

# What `config.model` accepts, field by field (the rules between fields are in `check`).
FIELDS = (
  fields.Field('model.kind', choices=KINDS),
  *(
    fields.Field(f'model.{name}', above=0) for name in ('d_model', 'depth', 'num_heads', 'mlp_dim')
  ),
  fields.Field('model.pool', choices=ea.text.POOLS),
  fields.Field(
    'model.interaction',
    choices=ea.text.INTERACTIONS,
    when=('model.interaction', lambda interaction: interaction is not None),
  ),
  fields.Field('model.positions', choices=ea.text.POSITIONS, default='learned'),
  fields.Field('model.patch_size', above=0, when=('model.kind', lambda kind: kind == 'vit')),
  *(
    fields.Field(f'model.{name}', minimum=0.0, below=1.0)
    for name in ('dropout_rate', 'attention_dropout_rate')
  ),
)


def check(config, dataset: Optional[data.Dataset] = None) -> None:
  """ConfigError for the first invalid field of `config.model`, alone or with the data
  (`dataset`, default `data.resolve(config)`) and the task it must serve."""
  m, d = config.model, config.dataset
  fields.check(config, FIELDS)
  inputs = data.resolve(dataset or config).input_kind
  if inputs not in READS[m.kind]:
    valid = [k for k in KINDS if inputs in READS[k]]
    what = 'pixel-token (dataset.pixels_as_tokens)' if inputs == 'pixels' else inputs
    raise fields.ConfigError(
      f'config.model.kind={m.kind!r} is not valid for the {what} '
      f'dataset {d.name!r}; valid choices: {", ".join(valid)}'
    )
  if config.task not in TASKS[m.kind]:
    valid = [k for k in KINDS if config.task in TASKS[k]]
    raise fields.ConfigError(
      f'config.model.kind={m.kind!r} is not valid for config.task='
      f'{config.task!r}; valid choices: {", ".join(valid)}'
    )
  if m.d_model % m.num_heads:
    divisors = [h for h in range(1, min(m.d_model, 64) + 1) if m.d_model % h == 0]
    raise fields.ConfigError(
      f'config.model.num_heads={m.num_heads} does not divide '
      f'config.model.d_model={m.d_model}; valid choices: '
      f'{", ".join(map(str, divisors))}'
    )
  positions = m.get('positions', 'learned')
  if positions != 'learned' and m.kind != 'text':
    raise fields.ConfigError(
      f'config.model.positions={positions!r} is not valid for '
      f"config.model.kind={m.kind!r}, which only has learned "
      f'positions; valid choices: learned'
    )
  if m.kind == 'vit':
    if d.image_size % m.patch_size:
      divisors = [p for p in range(1, d.image_size + 1) if d.image_size % p == 0]
      raise fields.ConfigError(
        f'config.model.patch_size={m.patch_size} does not divide '
        f'config.dataset.image_size={d.image_size}; valid choices: '
        f'{", ".join(map(str, divisors))}'
      )
  if m.get('reversible', False) and m.kind not in REVERSIBLE_KINDS:
    raise fields.ConfigError(
      f'config.model.reversible=True is not valid for config.model.'
      f'kind={m.kind!r} (it samples by decoding, which needs the '
      f'ordinary stack); valid kinds: {", ".join(REVERSIBLE_KINDS)}'
    )


def check_attention(
  config, dataset: Optional[data.Dataset] = None
) -> Tuple[hybrid.Mechanisms, registry.Options]:
  """The mechanism of `config.attention`, looked up once and configured for this model
  (the registry's own checks: options, causal form, lengths, rotary): (declaration,
  resolved options). A pattern ('linear+local', blocks taking mechanisms in turn; see
  `efficient_attn.layers.hybrid`) gives (its declarations, a tuple, and the options they share
  out, `hybrid.merged_options`), each mechanism checked as a single one is.
  ConfigError naming the field, value and valid choices."""
  a = config.attention
  decls = _declarations(a.mechanism)
  fields.check(config, (fields.Field('attention.projection', choices=registry.list_projections()),))
  mechanism = decls[0] if len(decls) == 1 else decls
  options = attention_options(config)
  try:
    own = hybrid.split_options(decls, options)
    if config.model.kind == 'mlp':  # no attention layer: only the options are resolved
      return mechanism, hybrid.merged_options(hybrid.resolve(decls, options))
  except ValueError as e:
    raise fields.ConfigError(f'config.attention: {e}') from None
  if len(decls) > 1:
    _check_pattern(config, decls)
  return mechanism, hybrid.merged_options(
    [(d, _check_layer(config, dataset, d, options)) for d, options in zip(decls, own)]
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


def _check_pattern(config, decls) -> None:
  """The rules of a pattern: its length divides the depth; reversible with one mechanism."""
  a, m = config.attention, config.model
  try:
    hybrid.check_depth(decls, m.depth)
  except ValueError as e:
    raise fields.ConfigError(f'config.model.depth={m.depth}: {e}') from None
  if m.get('reversible', False) and len(set(decls)) > 1:
    raise fields.ConfigError(
      f'config.model.reversible=True with mechanism {a.mechanism!r}: '
      f'the reversible stack takes one mechanism; valid: '
      f'reversible=False'
    )


def _check_layer(
  config, dataset, decl: registry.Mechanism, own: Dict[str, Any]
) -> registry.Options:
  """`decl`, a mechanism of config.attention, configured for this model with the options
  `own` that config.attention.options sets for it: its resolved options."""
  a = config.attention
  name = decl.name  # the block's mechanism (the whole pattern is config.attention.mechanism)
  num_kv_heads = a.get('num_kv_heads', 0)
  if num_kv_heads:  # 0: one key/value head per head
    try:
      multi_head.kv_heads(decl, a.projection, config.model.num_heads, num_kv_heads)
    except ValueError as e:
      raise fields.ConfigError(f'config.attention.num_kv_heads={num_kv_heads}: {e}') from None
  length, context = sequence_length(config, dataset)
  if (decl.fixed_length or a.projection == 'super') and length > context:
    what = f'mechanism {name!r}' if decl.fixed_length else "projection 'super'"
    raise fields.ConfigError(
      f'sequence length {length} (config.dataset.max_length={config.dataset.max_length}) '
      f'exceeds the fixed context length {context} that {what} is built for '
      f'(config.model.max_length={config.model.max_length}); valid: lengths <= {context}'
    )
  causal = config.model.kind == 'causal'
  if (
    decl.causal_only and config.model.get('pool') == 'cls' and (not causal)
  ):  # the causal model does not pool
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
      rotary=a.get('rotary', False),
    )
    m = config.model  # the head shapes the mechanism's options declare, for this scheme
    multi_head.head_layout(
      decl,
      options,
      projection=a.projection,
      heads=m.num_heads,
      head_dim=m.d_model // m.num_heads,
      kv_heads=multi_head.kv_heads(decl, a.projection, m.num_heads, num_kv_heads or None),
    )
    return options
  except ValueError as e:
    if causal and not decl.causal:
      valid = registry.names_where(lambda m: m.causal)
      what = 'it has' if name == a.mechanism else f'its mechanism {name!r} has'
      raise fields.ConfigError(
        f'config.attention.mechanism={a.mechanism!r} is not valid for '
        f'the causal model kind {config.model.kind!r}: {what} no '
        f'causal form; valid choices: {", ".join(valid)}'
      ) from None
    raise fields.ConfigError(f'config.attention: {e}') from None


def attention_options(config) -> Dict[str, Any]:
  """The options set in `config.attention.options` (None entries mean 'the default')."""
  options = config.attention.options
  options = options.to_dict() if hasattr(options, 'to_dict') else dict(options or {})
  return {k: v for k, v in options.items() if v is not None}


def sequence_length(config, dataset: Optional[data.Dataset] = None) -> Tuple[int, int]:
  """(tokens the attention sees, context length the model is built for)."""
  m, d = config.model, config.dataset
  if m.kind == 'vit':
    n = ea.vit.vit_length(d.image_size, m.patch_size, m.pool)
    return n, n
  if m.kind == 'text':
    cls = m.pool == 'cls'
    n = token_length(config, dataset)
    return n + cls, (m.max_length or n) + cls
  if m.kind == 'causal':
    n = (
      d.max_length
      if data.resolve(dataset or config).input_kind == 'sequence'
      else d.image_size**2 * d.channels
    )
    return n, n
  return 0, 0


def token_length(config, dataset: Optional[data.Dataset] = None) -> int:
  """The token sequence a 'text' model reads: dataset.max_length, or every pixel."""
  d = config.dataset
  if data.resolve(dataset or config).input_kind == 'pixels':
    return d.image_size**2 * d.channels
  return d.max_length


def sequence_axis(config) -> Optional[str]:
  """'sequence' when `config.train.mesh` splits the sequence (its 'sequence' size is not
  1: the attention layers then run on their block of it, `train/mesh.py`), else None."""
  size = (config.train.get('mesh') or {}).get('sequence', 1)
  return 'sequence' if size != 1 else None


def transformer_config(config, **changes) -> ea.TransformerConfig:
  """The encoder settings of `config.model` and `config.attention` (`changes`: fields set
  otherwise, e.g. `mechanism`, the declaration the config was resolved to, or
  `sequence_axis`)."""
  m, a = config.model, config.attention
  axis = sequence_axis(config)
  return ea.TransformerConfig(
    **{
      **dict(
        d_model=m.d_model,
        depth=m.depth,
        num_heads=m.num_heads,
        mlp_dim=m.mlp_dim,
        mechanism=a.mechanism,
        projection=a.projection,
        options=attention_options(config),
        dropout_rate=m.dropout_rate,
        attention_dropout_rate=m.attention_dropout_rate,
        reversible=m.reversible,
        rotary=a.rotary,
        num_kv_heads=a.get('num_kv_heads') or None,
        dtype=DTYPES[config.train.dtype],
      ),
      **({'sequence_axis': axis} if axis else {}),
      **changes,
    }
  )


def create_model(
  config,
  dataset: Optional[data.Dataset] = None,
  mechanism: Optional[hybrid.Mechanisms] = None,
  split_sequence: bool = True,
) -> nn.Module:
  """The model of `config.model.kind` (LoRA-adapted if `config.lora.rank > 0`).

  `dataset` (default `data.resolve(config)`) and `mechanism` (the declaration of
  `config.attention.mechanism`, default: looked up by the model) are what
  `validate.resolve` resolved. The attention layers split the sequence over the
  ambient mesh's 'sequence' axis when `config.train.mesh` asks for it, unless
  `split_sequence=False` (a trained model loaded for use outside a mesh: the same
  parameters).
  """
  m = config.model
  dataset = data.resolve(dataset or config)
  changes = {'mechanism': mechanism} if mechanism is not None else {}
  if not split_sequence and sequence_axis(config):
    changes['sequence_axis'] = None
  num_classes = data.num_classes(dataset)
  if m.kind == 'vit':
    model = ea.ViT(
      transformer_config(config, **changes),
      num_classes=num_classes,
      patch_size=m.patch_size,
      pool=m.pool,
    )
  elif m.kind == 'text':
    inputs = dataset.input_kind
    vocab = {
      'text': data.TEXT_VOCAB_SIZE,
      'text_pair': data.TEXT_VOCAB_SIZE,
      'pixels': PIXEL_LEVELS,
    }.get(inputs) or data.vocab_size(dataset)
    encoder = transformer_config(
      config, max_length=m.max_length or token_length(config, dataset), **changes
    )
    positions = m.get('positions', 'learned')
    if inputs == 'text_pair':
      model = ea.TextMatcher(
        encoder,
        num_classes=num_classes,
        vocab_size=vocab,
        pool=m.pool,
        interaction=m.get('interaction', 'concat'),
        positions=positions,
      )
    else:
      model = ea.TextClassifier(
        encoder,
        num_classes=num_classes,
        vocab_size=vocab,
        pool=m.pool,
        padding=inputs != 'pixels',
        positions=positions,
      )
  elif m.kind == 'causal':
    sequence = dataset.input_kind == 'sequence'
    model = ea.CausalTransformer(
      transformer_config(config, max_length=sequence_length(config, dataset)[1], **changes),
      vocab_size=data.vocab_size(dataset) if sequence else PIXEL_LEVELS,
    )
  elif m.kind == 'mlp':
    model = ea.MLP(num_classes, depth=m.depth, width=m.mlp_dim, dtype=DTYPES[config.train.dtype])
  else:
    raise ValueError(
      f'config.model.kind={m.kind!r} is not valid; valid choices: {", ".join(KINDS)}'
    )
  return adapters.wrap(config, model)


def dummy_inputs(config, batch_size: int = 1, dataset: Optional[data.Dataset] = None):
  """Zero inputs of the shape `create_model(config)` takes."""
  d, kind = config.dataset, config.model.kind
  if kind in ('vit', 'mlp'):
    return jnp.zeros((batch_size, d.image_size, d.image_size, d.channels), jnp.float32)
  if kind == 'text':
    pair = (2,) if data.resolve(dataset or config).input_kind == 'text_pair' else ()
    return jnp.ones((batch_size,) + pair + (token_length(config, dataset),), jnp.int32)
  return jnp.zeros((batch_size, sequence_length(config, dataset)[0]), jnp.int32)


def count_params(params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))


def path_str(path) -> str:
  """A jax key path -> 'encoder/block_0/attention/query/kernel'."""
  return jax.tree_util.keystr(path, simple=True, separator='/')


def parameter_counts(params) -> Tuple[int, int]:
  """(total parameters, parameters of an attention layer).

  An attention layer is a module named 'attention', projections, W_A and mechanism
  parameters included; all blocks' are alike, but in a hybrid stack (blocks taking
  mechanisms in turn, `efficient_attn.layers.hybrid`) this is their mean, rounded.
  """
  layers = {}
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = path_str(path).split('/')
    if 'attention' in names:
      layer = '/'.join(names[: names.index('attention') + 1])
      layers[layer] = layers.get(layer, 0) + x.size
  return count_params(params), round(sum(layers.values()) / len(layers)) if layers else 0

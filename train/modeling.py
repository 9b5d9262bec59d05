"""Builds the model `config.model.kind` names, straight from the config.

    model = modeling.create_model(config)            # ViT, TextClassifier, CausalTransformer, MLP
    x = modeling.dummy_inputs(config, batch_size=2)   # what model(x, train=...) takes

The trainer, which has resolved the config once (`validate.resolve`: `check` here gives
the inputs the model reads, `train/attention.py` the attention), also hands these its
`data.Dataset` and the resolved attention, so that nothing here looks them up or
checks them again.

Kinds: 'vit' (images), 'text' (byte or token sequences; a dual encoder for
pairs of documents), 'causal' (pixel tokens, the autoregressive pixel model;
token sequences labelled at each position, e.g. MQAR) and 'mlp' (images, the
LoRA study's base). With `config.lora.rank > 0` the model comes wrapped in
`lora.Adapted` (see `train/adapters.py`).
"""

import dataclasses
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from configs import fields
import data
from efficient_attn import models as ea
from efficient_attn import registry
from efficient_attn.layers import hybrid
from train import adapters
from train import attention as attention_lib

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


@dataclasses.dataclass(frozen=True)
class ModelInputs:
  """What the model of `config.model` reads (`model_inputs`): one example's `shape` and
  `dtype` (images `[h, w, c]` float32; tokens `[length]`, pairs `[2, length]`, int32),
  the `fill` of its example inputs, the tokens its attention sees (`length`) and the
  context length it is built for (`context`; both 0 for a model without attention)."""

  shape: Tuple[int, ...]
  dtype: Any
  fill: int
  length: int
  context: int

  def example(self, batch_size: int = 1) -> jnp.ndarray:
    """Inputs `[batch_size, *shape]` of the model, all `fill`: what it is initialised on."""
    return jnp.full((batch_size, *self.shape), self.fill, self.dtype)


def check(config, dataset: Optional[data.Dataset] = None) -> ModelInputs:
  """ConfigError for the first invalid field of `config.model`, alone or with the data
  (`dataset`, default `data.resolve(config)`) and the task it must serve; else what the
  model reads (`model_inputs`)."""
  model, dataset_config = config.model, config.dataset
  fields.check(config, FIELDS)
  inputs = data.resolve(dataset or config).input_kind
  if inputs not in READS[model.kind]:
    valid = [kind for kind in KINDS if inputs in READS[kind]]
    what = 'pixel-token (dataset.pixels_as_tokens)' if inputs == 'pixels' else inputs
    raise fields.ConfigError(
      f'config.model.kind={model.kind!r} is not valid for the {what} '
      f'dataset {dataset_config.name!r}; valid choices: {", ".join(valid)}'
    )
  if config.task not in TASKS[model.kind]:
    valid = [kind for kind in KINDS if config.task in TASKS[kind]]
    raise fields.ConfigError(
      f'config.model.kind={model.kind!r} is not valid for config.task='
      f'{config.task!r}; valid choices: {", ".join(valid)}'
    )
  if model.d_model % model.num_heads:
    divisors = [h for h in range(1, min(model.d_model, 64) + 1) if model.d_model % h == 0]
    raise fields.ConfigError(
      f'config.model.num_heads={model.num_heads} does not divide '
      f'config.model.d_model={model.d_model}; valid choices: '
      f'{", ".join(map(str, divisors))}'
    )
  positions = model.get('positions', 'learned')
  if positions != 'learned' and model.kind != 'text':
    raise fields.ConfigError(
      f'config.model.positions={positions!r} is not valid for '
      f"config.model.kind={model.kind!r}, which only has learned "
      f'positions; valid choices: learned'
    )
  if model.kind == 'vit':
    image_size = dataset_config.image_size
    if image_size % model.patch_size:
      divisors = [p for p in range(1, image_size + 1) if image_size % p == 0]
      raise fields.ConfigError(
        f'config.model.patch_size={model.patch_size} does not divide '
        f'config.dataset.image_size={image_size}; valid choices: '
        f'{", ".join(map(str, divisors))}'
      )
  if model.get('reversible', False) and model.kind not in REVERSIBLE_KINDS:
    raise fields.ConfigError(
      f'config.model.reversible=True is not valid for config.model.'
      f'kind={model.kind!r} (it samples by decoding, which needs the '
      f'ordinary stack); valid kinds: {", ".join(REVERSIBLE_KINDS)}'
    )
  return model_inputs(config, dataset)


def check_attention(
  config, dataset: Optional[data.Dataset] = None
) -> Tuple[hybrid.Mechanisms, registry.Options]:
  """ConfigError for the first invalid field of `config.attention` (`attention.resolve`,
  for the lengths of this model); else its mechanism resolved once: (the declaration, or
  a pattern's tuple of them, and the complete options)."""
  inputs = model_inputs(config, dataset)
  attention = attention_lib.resolve(config, length=inputs.length, context=inputs.context)
  return attention.mechanism, attention.options


def model_inputs(config, dataset: Optional[data.Dataset] = None) -> ModelInputs:
  """What the model of `config.model` reads (`dataset`, default `data.resolve(config)`)."""
  kind, dataset_config = config.model.kind, config.dataset
  length, context = sequence_length(config, dataset)
  if kind in ('vit', 'mlp'):
    side = dataset_config.image_size
    return ModelInputs((side, side, dataset_config.channels), jnp.float32, 0, length, context)
  if kind == 'text':
    pair = (2,) if data.resolve(dataset or config).input_kind == 'text_pair' else ()
    return ModelInputs((*pair, token_length(config, dataset)), jnp.int32, 1, length, context)
  return ModelInputs((length,), jnp.int32, 0, length, context)


def sequence_length(config, dataset: Optional[data.Dataset] = None) -> Tuple[int, int]:
  """(tokens the attention sees, context length the model is built for)."""
  model, dataset_config = config.model, config.dataset
  if model.kind == 'vit':
    tokens = ea.vit.vit_length(dataset_config.image_size, model.patch_size, model.pool)
    return tokens, tokens
  if model.kind == 'text':
    cls = model.pool == 'cls'
    tokens = token_length(config, dataset)
    return tokens + cls, (model.max_length or tokens) + cls
  if model.kind == 'causal':
    tokens = (
      dataset_config.max_length
      if data.resolve(dataset or config).input_kind == 'sequence'
      else dataset_config.image_size**2 * dataset_config.channels
    )
    return tokens, tokens
  return 0, 0


def token_length(config, dataset: Optional[data.Dataset] = None) -> int:
  """The token sequence a 'text' model reads: dataset.max_length, or every pixel."""
  dataset_config = config.dataset
  if data.resolve(dataset or config).input_kind == 'pixels':
    return dataset_config.image_size**2 * dataset_config.channels
  return dataset_config.max_length


def sequence_axis(config) -> Optional[str]:
  """'sequence' when `config.train.mesh` splits the sequence (its 'sequence' size is not
  1: the attention layers then run on their block of it, `train/mesh.py`), else None."""
  size = (config.train.get('mesh') or {}).get('sequence', 1)
  return 'sequence' if size != 1 else None


def transformer_config(
  config, attention: Optional[attention_lib.Attention] = None, **changes
) -> ea.TransformerConfig:
  """The encoder settings of `config.model` and of the attention: `attention` resolved
  (`attention.resolve`: the encoder configures nothing again), else `config.attention`'s
  fields as they are (the encoder resolves them). `changes`: fields set otherwise, e.g.
  `sequence_axis`."""
  model = config.model
  axis = sequence_axis(config)
  return ea.TransformerConfig(
    **{
      **dict(
        d_model=model.d_model,
        depth=model.depth,
        num_heads=model.num_heads,
        mlp_dim=model.mlp_dim,
        **_attention_settings(config, attention),
        dropout_rate=model.dropout_rate,
        attention_dropout_rate=model.attention_dropout_rate,
        reversible=model.reversible,
        dtype=DTYPES[config.train.dtype],
      ),
      **({'sequence_axis': axis} if axis else {}),
      **changes,
    }
  )


def _attention_settings(config, attention: Optional[attention_lib.Attention]) -> dict:
  """The `TransformerConfig` fields of the attention: resolved, or the config's own."""
  if attention is not None:
    return dict(
      mechanism=attention.stack,
      projection=attention.projection,
      options=attention.options,
      rotary=attention.rotary,
      num_kv_heads=attention.num_kv_heads,
    )
  settings = config.attention
  return dict(
    mechanism=settings.mechanism,
    projection=settings.projection,
    options=attention_lib.config_options(config),
    rotary=settings.rotary,
    num_kv_heads=settings.get('num_kv_heads') or None,
  )


def create_model(
  config,
  dataset: Optional[data.Dataset] = None,
  attention: Optional[attention_lib.Attention] = None,
  split_sequence: bool = True,
) -> nn.Module:
  """The model of `config.model.kind` (LoRA-adapted if `config.lora.rank > 0`).

  `dataset` (default `data.resolve(config)`) and `attention` (`config.attention`
  resolved, `attention.resolve`; default: its fields, resolved by the model) are what
  `validate.resolve` resolved. The attention layers split the sequence over the
  ambient mesh's 'sequence' axis when `config.train.mesh` asks for it, unless
  `split_sequence=False` (a trained model loaded for use outside a mesh: the same
  parameters).
  """
  settings = config.model
  dataset = data.resolve(dataset or config)
  changes = {} if split_sequence or not sequence_axis(config) else {'sequence_axis': None}
  num_classes = data.num_classes(dataset)
  if settings.kind == 'vit':
    model = ea.ViT(
      transformer_config(config, attention, **changes),
      num_classes=num_classes,
      patch_size=settings.patch_size,
      pool=settings.pool,
    )
  elif settings.kind == 'text':
    inputs = dataset.input_kind
    vocab = {
      'text': data.TEXT_VOCAB_SIZE,
      'text_pair': data.TEXT_VOCAB_SIZE,
      'pixels': PIXEL_LEVELS,
    }.get(inputs) or data.vocab_size(dataset)
    encoder = transformer_config(
      config,
      attention,
      max_length=settings.max_length or token_length(config, dataset),
      **changes,
    )
    positions = settings.get('positions', 'learned')
    if inputs == 'text_pair':
      model = ea.TextMatcher(
        encoder,
        num_classes=num_classes,
        vocab_size=vocab,
        pool=settings.pool,
        interaction=settings.get('interaction', 'concat'),
        positions=positions,
      )
    else:
      model = ea.TextClassifier(
        encoder,
        num_classes=num_classes,
        vocab_size=vocab,
        pool=settings.pool,
        padding=inputs != 'pixels',
        positions=positions,
      )
  elif settings.kind == 'causal':
    sequence = dataset.input_kind == 'sequence'
    model = ea.CausalTransformer(
      transformer_config(
        config, attention, max_length=sequence_length(config, dataset)[1], **changes
      ),
      vocab_size=data.vocab_size(dataset) if sequence else PIXEL_LEVELS,
    )
  elif settings.kind == 'mlp':
    model = ea.MLP(
      num_classes, depth=settings.depth, width=settings.mlp_dim, dtype=DTYPES[config.train.dtype]
    )
  else:
    raise ValueError(
      f'config.model.kind={settings.kind!r} is not valid; valid choices: {", ".join(KINDS)}'
    )
  return adapters.wrap(config, model)


def dummy_inputs(config, batch_size: int = 1, dataset: Optional[data.Dataset] = None):
  """Zero inputs of the shape `create_model(config)` takes (ones for token ids)."""
  return model_inputs(config, dataset).example(batch_size)


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

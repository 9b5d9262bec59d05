"""Builds the model a config names, and counts its parameters.

    model = models.create_model(config)           # ViT, TextClassifier, CausalTransformer, MLP
    x = models.dummy_inputs(config, batch_size=2)  # what model(x, train=...) takes

`MODEL_KINDS` maps `config.model.kind` to a `ModelKind`; a new kind is one
more entry. With `config.lora.rank > 0` the model comes wrapped in
`lora.Adapted` (see `train/adapters.py`).
"""
import dataclasses
from typing import Any, Callable, Dict, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from efficient_attn import models as ea_models
from train import adapters
from train import input_pipeline

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelKind:
  """How to build one kind of model from a config.

  Attributes:
    build: `build(config, **overrides) -> nn.Module`.
    input_kind: the dataset kind it consumes ('image' or 'text').
    dummy_inputs: `dummy_inputs(config, batch_size) -> array` for `init`.
    sequence_length: `sequence_length(config) -> (tokens the attention sees,
      context length the model is built for)`.
    causal: whether its attention layers are causal (checked against the
      mechanism by the config validation).
    tasks: the `config.task` values it serves.
  """
  build: Callable[..., nn.Module]
  input_kind: str
  dummy_inputs: Callable[[Any, int], jnp.ndarray]
  sequence_length: Callable[[Any], Tuple[int, int]]
  causal: bool = False
  tasks: Tuple[str, ...] = ('classification',)


def compute_dtype(config):
  return DTYPES[config.train.dtype]


def attention_options(config) -> Dict[str, Any]:
  """`config.attention.options` as a plain dict."""
  options = config.attention.options
  return options.to_dict() if hasattr(options, 'to_dict') else dict(options or {})


def _common(config) -> Dict[str, Any]:
  m, a = config.model, config.attention
  return dict(num_classes=input_pipeline.num_classes(config), d_model=m.d_model, depth=m.depth,
              num_heads=m.num_heads, mlp_dim=m.mlp_dim, pool=m.pool,
              mechanism=a.mechanism, projection=a.projection,
              options=attention_options(config), dropout_rate=m.dropout_rate,
              attention_dropout_rate=m.attention_dropout_rate, dtype=compute_dtype(config))


def _vit(config, **overrides) -> nn.Module:
  return ea_models.ViT(patch_size=config.model.patch_size,
                       **{**_common(config), **overrides})


def _vit_inputs(config, batch_size: int):
  d = config.dataset
  return jnp.zeros((batch_size, d.image_size, d.image_size, d.channels), jnp.float32)


def _vit_length(config):
  n = (config.dataset.image_size // config.model.patch_size) ** 2
  n += config.model.pool == 'cls'
  return n, n


def _text_max_length(config) -> int:
  return config.model.max_length or config.dataset.max_length


def _text(config, **overrides) -> nn.Module:
  return ea_models.TextClassifier(vocab_size=input_pipeline.TEXT_VOCAB_SIZE,
                                  max_length=_text_max_length(config),
                                  **{**_common(config), **overrides})


def _text_inputs(config, batch_size: int):
  return jnp.ones((batch_size, config.dataset.max_length), jnp.int32)


def _text_length(config):
  cls = config.model.pool == 'cls'
  return config.dataset.max_length + cls, _text_max_length(config) + cls


PIXEL_LEVELS = 256  # causal pixel model: tokens 0..255, start token 256


def _pixels_length(config):
  n = config.dataset.image_size ** 2
  return n, n


def _causal(config, **overrides) -> nn.Module:
  kwargs = {k: v for k, v in _common(config).items() if k not in ('num_classes', 'pool')}
  return ea_models.CausalTransformer(vocab_size=PIXEL_LEVELS,
                                     max_length=_pixels_length(config)[1],
                                     **{**kwargs, **overrides})


def _causal_inputs(config, batch_size: int):
  return jnp.zeros((batch_size, _pixels_length(config)[0]), jnp.int32)


class MLP(nn.Module):
  """Flatten -> `depth` x (Dense(width) -> ReLU) -> Dense(num_classes) 'head'.

  The LoRA study's base model (784-64-64-10 on MNIST: depth 2, width 64;
  55,050 parameters). Layers: 'hidden_0', ..., 'head'.
  """
  num_classes: int
  depth: int = 2
  width: int = 64
  dtype: Any = None

  @nn.compact
  def __call__(self, images, *, train: bool = False):
    """images `[b, h, w, c]` -> logits `[b, num_classes]` float32."""
    del train
    x = images.reshape((images.shape[0], -1)).astype(self.dtype or jnp.float32)
    for i in range(self.depth):
      x = nn.relu(nn.Dense(self.width, dtype=self.dtype, name=f'hidden_{i}')(x))
    return nn.Dense(self.num_classes, dtype=self.dtype, name='head')(x).astype(jnp.float32)


def _mlp(config, **overrides) -> nn.Module:
  kwargs = dict(num_classes=input_pipeline.num_classes(config), depth=config.model.depth,
                width=config.model.mlp_dim, dtype=compute_dtype(config))
  return MLP(**{**kwargs, **overrides})


MODEL_KINDS = {
    'vit': ModelKind(_vit, 'image', _vit_inputs, _vit_length),
    'text': ModelKind(_text, 'text', _text_inputs, _text_length),
    'causal': ModelKind(_causal, 'pixels', _causal_inputs, _pixels_length, causal=True,
                        tasks=('pixel_lm',)),
    'mlp': ModelKind(_mlp, 'image', _vit_inputs, lambda config: (0, 0)),
}


def get_kind(name: str) -> ModelKind:
  if name not in MODEL_KINDS:
    raise ValueError(f'config.model.kind={name!r} is not valid; valid choices: '
                     f'{", ".join(MODEL_KINDS)}')
  return MODEL_KINDS[name]


def create_model(config, **overrides) -> nn.Module:
  """The model of `config.model.kind` (LoRA-adapted if `config.lora.rank > 0`);
  `overrides` replace constructor arguments of the base model."""
  return adapters.wrap(config, get_kind(config.model.kind).build(config, **overrides))


def dummy_inputs(config, batch_size: int = 1):
  return get_kind(config.model.kind).dummy_inputs(config, batch_size)


def sequence_length(config) -> Tuple[int, int]:
  """(tokens the attention sees, context length the model is built for)."""
  return get_kind(config.model.kind).sequence_length(config)


def path_str(path) -> str:
  """A jax key path -> 'encoder/block_0/attention/query/kernel'."""
  return '/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path)


def count_params(params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))


def count_trainable(params, trainable_fn=None) -> int:
  """Parameters `trainable_fn` (a predicate on paths; None: all) lets train."""
  if trainable_fn is None:
    return count_params(params)
  return int(sum(x.size for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
                 if trainable_fn(path_str(path))))


def parameter_counts(params) -> Tuple[int, int]:
  """(total parameters, parameters of one attention layer).

  The attention layer is the first module named 'attention' (all blocks are
  alike), projections, W_A and mechanism parameters included.
  """
  layers = {}
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = path_str(path).split('/')
    if 'attention' in names:
      layer = '/'.join(names[:names.index('attention') + 1])
      layers[layer] = layers.get(layer, 0) + x.size
  first = min(layers, key=lambda k: (len(k), k)) if layers else None
  return count_params(params), int(layers[first]) if first else 0

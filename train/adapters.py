"""`config.lora` in the trainer: adapted models, frozen base, init_from, merging.

    config.lora.rank = 8                       # 0: off (full training)
    config.lora.targets = 'default,head'       # presets and/or regexes, ','-joined
    model = adapters.wrap(config, base_model)  # lora.Adapted when rank > 0
    trainable = adapters.trainable_fn(config)  # lora.is_adapter: optax freezes the rest
    params = adapters.init_params(config, fresh, loaded)   # init_from: lora.load_base
    model, params = adapters.unwrap(config, model, params) # plain model, merged params

Targets are matched (`re.search`) against each Dense layer's module path, e.g.
'encoder/block_0/attention/query' (ViT), 'decoder/block_0/mlp/Dense_1'
(causal), 'hidden_0' / 'head' (MLP). A model trained from scratch with LoRA
only must adapt its zero-initialised classifier 'head' (include 'head'), or
its output stays zero.
"""
from typing import Callable, Optional, Tuple

from efficient_attn import lora

PRESETS = {
    'default': lora.DEFAULT_TARGETS,      # attention projections + Transformer MLP
    'attention': lora.ATTENTION_TARGETS,
    'mlp': lora.MLP_TARGETS,
    'head': (r'(^|/)(head|logits)$',),    # classifier head / causal model's logits
    'all': lora.ALL_DENSE,                # every Dense / DenseGeneral
}


def targets(spec: str) -> Tuple[str, ...]:
  """'default,head' -> the regexes; items that are not preset names are regexes."""
  out = []
  for item in (s.strip() for s in spec.split(',')):
    if item:
      out.extend(PRESETS.get(item, (item,)))
  return tuple(out)


def lora_config(config) -> Optional[lora.LoraConfig]:
  """The `LoraConfig` of `config.lora`, or None when LoRA is off (rank 0 or no group)."""
  c = config.get('lora')
  if c is None or c.get('rank', 0) <= 0:
    return None
  alpha = c.get('alpha', 0.0)
  return lora.LoraConfig(rank=c.rank, alpha=alpha or None,
                         targets=targets(c.get('targets', 'default')))


def wrap(config, model):
  """`model` with adapters (`lora.Adapted`) when LoRA is on, else `model`."""
  cfg = lora_config(config)
  return model if cfg is None else lora.Adapted(model, cfg)


def trainable_fn(config) -> Optional[Callable[[str], bool]]:
  """None (train everything), or `lora.is_adapter` (train the adapters only)."""
  return None if lora_config(config) is None else lora.is_adapter


def init_params_fn(config):
  """`init_params(config, fresh, loaded)` for `init_from` when LoRA is on, else None."""
  return None if lora_config(config) is None else init_params


def init_params(config, fresh, loaded):
  """Fresh adapters on the loaded base (`lora.load_base`).

  Raises ValueError naming the missing, unexpected or reshaped leaves when the
  `init_from` checkpoint is not a base of this model (e.g. a different width or
  number of classes, or a checkpoint that has adapters itself).
  """
  try:
    return lora.load_base(fresh, loaded)
  except ValueError as e:
    raise ValueError(f'config.init_from={config.init_from!r} is not a base of this LoRA '
                     f'model: {e}') from None


def unwrap(config, model, params):
  """(plain model, params with the adapters merged into the kernels).

  What generation and export use: the merged model computes the same function
  without the interceptor. Without LoRA, returns its inputs.
  """
  cfg = lora_config(config)
  if cfg is None or not isinstance(model, lora.Adapted):
    return model, params
  return model.module, lora.merge(params, scale=cfg.scale)


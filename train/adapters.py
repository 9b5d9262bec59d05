"""`config.lora` and `config.init_from`: adapted models, frozen bases, merging.

    config.lora.rank = 8                        # 0: off (full training)
    config.lora.targets = 'default,head'        # presets and/or regexes, ','-joined
    model = adapters.wrap(config, base_model)   # lora.Adapted when rank > 0
    tx = adapters.optimizer(config, tx)         # lora.optimizer: only the adapters train
    params = adapters.init_from(config, fresh, loaded)   # a base run's params
    model, params = adapters.unwrap(config, model, params)  # plain model, merged params

Targets are matched (`re.search`) against each Dense layer's module path, e.g.
'encoder/block_0/attention/query' (ViT), 'decoder/block_0/mlp/Dense_1'
(causal), 'hidden_0' / 'head' (MLP). A model trained from scratch with LoRA
only must adapt its zero-initialised classifier 'head' (include 'head'), or
its output stays zero.
"""

import re
from typing import Optional, Tuple

from etils import epath
import jax
import optax

from configs import fields
from efficient_attn.layers import lora

PRESETS = {
  'default': lora.DEFAULT_TARGETS,  # attention projections + Transformer MLP
  'attention': lora.ATTENTION_TARGETS,
  'mlp': lora.MLP_TARGETS,
  'head': (r'(^|/)(head|logits)$',),  # classifier head / causal model's logits
  'all': lora.ALL_DENSE,  # every Dense / DenseGeneral
}


FIELDS = (  # what `config.lora` accepts (its targets are checked in `check`)
  fields.Field('lora.rank', minimum=0, note='(0 = off)', default=0),
  fields.Field(
    'lora.alpha',
    minimum=0,
    note='(0: scale 1)',
    default=0.0,
    when=('lora.rank', lambda rank: (rank or 0) > 0),
  ),
)


def check(config) -> None:
  """ConfigError for the first invalid field of `config.init_from` and `config.lora`:
  init_from must be an earlier run's workdir; lora.rank >= 0; with rank > 0, every
  target a preset or a regular expression, and alpha >= 0."""
  if config.get('init_from') and not epath.Path(config.init_from).is_dir():
    raise fields.ConfigError(
      f'config.init_from={config.init_from!r} is not a directory; it '
      f'must be the workdir of an earlier run (or empty)'
    )
  if config.get('lora') is None:
    return
  fields.check(config, FIELDS)
  if config.lora.get('rank', 0) == 0:
    return
  for target in targets(config.lora.get('targets', 'default')):
    try:
      re.compile(target)
    except re.error as e:
      raise fields.ConfigError(
        f'config.lora.targets={config.lora.targets!r}: {target!r} is neither a preset '
        f'({", ".join(PRESETS)}) nor a valid regular expression ({e})'
      ) from None


def targets(spec: str) -> Tuple[str, ...]:
  """'default,head' -> the regexes; items that are not preset names are regexes."""
  out = []
  for item in (s.strip() for s in spec.split(',')):
    if item:
      out.extend(PRESETS.get(item, (item,)))
  return tuple(out)


def lora_config(config) -> Optional[lora.LoraConfig]:
  """The `LoraConfig` of `config.lora`, or None when LoRA is off (rank 0 or no group)."""
  settings = config.get('lora')
  if settings is None or settings.get('rank', 0) <= 0:
    return None
  alpha = settings.get('alpha', 0.0)
  return lora.LoraConfig(
    rank=settings.rank, alpha=alpha or None, targets=targets(settings.get('targets', 'default'))
  )


def wrap(config, model):
  """`model` with adapters (`lora.Adapted`) when LoRA is on, else `model`."""
  cfg = lora_config(config)
  return model if cfg is None else lora.Adapted(model, cfg)


def optimizer(config, tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` for every parameter, or with LoRA on for the adapters only (the base frozen)."""
  return tx if lora_config(config) is None else lora.optimizer(tx)


def trainable_count(config, params) -> int:
  """Parameters the optimiser changes (with LoRA: the adapters)."""
  return lora.count_params(params, trainable_only=lora_config(config) is not None)


def init_from(config, fresh, loaded):
  """`fresh` params with `loaded` (the `config.init_from` run's) copied in.

  With LoRA: the whole base, fresh adapters (`lora.load_base`); raises
  ValueError naming the missing, unexpected or reshaped leaves when the
  checkpoint is not a base of this model. Without: every leaf whose path and
  shape match is copied (a new head or changed layer keeps its initialisation).
  Returns (params, report): report lists 'copied', 'fresh' and 'unused' paths.
  """
  flat_loaded = {
    jax.tree_util.keystr(p, simple=True, separator='/'): x
    for p, x in jax.tree_util.tree_flatten_with_path(loaded)[0]
  }
  if lora_config(config) is not None:
    try:
      params = lora.load_base(fresh, loaded)
    except ValueError as e:
      raise ValueError(
        f'config.init_from={config.init_from!r} is not a base of this LoRA model: {e}'
      ) from None
    return params, {'copied': sorted(flat_loaded), 'fresh': [], 'unused': []}
  report = {'copied': [], 'fresh': []}

  def pick(path, x):
    name = jax.tree_util.keystr(path, simple=True, separator='/')
    old = flat_loaded.get(name)
    if old is not None and old.shape == x.shape:
      report['copied'].append(name)
      return old.astype(x.dtype)
    report['fresh'].append(name)
    return x

  params = jax.tree_util.tree_map_with_path(pick, fresh)
  report['unused'] = sorted(set(flat_loaded) - set(report['copied']))
  return params, report


def unwrap(config, model, params):
  """(plain model, params with the adapters merged into the kernels).

  What generation and export use: the merged model computes the same function
  without the interceptor. Without LoRA, returns its inputs.
  """
  cfg = lora_config(config)
  if cfg is None or not isinstance(model, lora.Adapted):
    return model, params
  return model.module, lora.merge(params, scale=cfg.scale)

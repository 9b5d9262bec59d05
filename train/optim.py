"""Optimiser: linear warmup + cosine decay, decoupled weight decay, clipping, freezing.

    tx = optim.create_optimizer(config, num_steps, trainable_fn=None)
    lr = optim.learning_rate_schedule(config, num_steps)(step)
"""
from typing import Callable, Optional

import jax
import optax

from train import models

OPTIMIZERS = ('adamw', 'sgd')


def learning_rate_schedule(config, num_steps: int) -> optax.Schedule:
  """0 -> optim.learning_rate over warmup_steps, then cosine to 0 at num_steps."""
  o = config.optim
  warmup = min(o.warmup_steps, max(num_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=o.learning_rate, warmup_steps=warmup,
      decay_steps=max(num_steps, warmup + 1), end_value=0.0)


def _decay_mask(params):
  """Weight decay on matrices (kernels, embeddings), not on biases or norms."""
  return jax.tree.map(lambda x: x.ndim > 1, params)


def create_optimizer(config, num_steps: int,
                     trainable_fn: Optional[Callable[[str], bool]] = None
                     ) -> optax.GradientTransformation:
  """The optax transformation of `config.optim`.

  Args:
    config: the experiment config.
    num_steps: length of the cosine schedule.
    trainable_fn: None (train every parameter) or a predicate on parameter
      paths ('encoder/block_0/attention/query/kernel'); parameters it rejects
      get zero updates (optax.multi_transform), and the gradient clipping norm
      is taken over the trainable ones only.
  """
  o = config.optim
  lr = learning_rate_schedule(config, num_steps)
  chain = [optax.clip_by_global_norm(o.grad_clip)] if o.grad_clip > 0 else []
  if o.name == 'adamw':
    chain.append(optax.adamw(lr, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay,
                             mask=_decay_mask))
  elif o.name == 'sgd':
    chain += [optax.add_decayed_weights(o.weight_decay, mask=_decay_mask),
              optax.sgd(lr, momentum=o.b1 or None)]
  else:
    raise ValueError(f'config.optim.name={o.name!r} is not valid; valid choices: '
                     f'{", ".join(OPTIMIZERS)}')
  tx = optax.chain(*chain)
  if trainable_fn is None:
    return tx

  def labels(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, _: 'train' if trainable_fn(models.path_str(path)) else 'freeze', params)
  return optax.multi_transform({'train': tx, 'freeze': optax.set_to_zero()}, labels)

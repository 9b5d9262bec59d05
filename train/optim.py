"""Optimiser: linear warmup + cosine decay, decoupled weight decay, clipping, LoRA freezing.

tx = optim.create_optimizer(config, num_steps)
lr = optim.learning_rate_schedule(config, num_steps)(step)
tx, lr, warmup = optim.create(config, num_steps)   # the three at once (the trainer)
"""

from typing import Tuple

import jax
import optax

from configs import fields
from train import adapters

OPTIMIZERS = ('adamw', 'sgd')
FIELDS = (  # what `config.optim` accepts
  fields.Field('optim.name', choices=OPTIMIZERS),
  fields.Field('optim.learning_rate', above=0),
  fields.Field('optim.warmup_steps', minimum=0),
  fields.Field('optim.weight_decay', minimum=0),
  fields.Field('optim.grad_clip', minimum=0),
  fields.Field('optim.b1', minimum=0.0, below=1.0),
  fields.Field('optim.b2', minimum=0.0, below=1.0),
  fields.Field('optim.max_warmup_fraction', minimum=0.0, note='(1 = no cap)', default=1.0),
)


def check(config) -> None:
  """ConfigError (`fields.ConfigError`) for the first invalid field of `config.optim`."""
  fields.check(config, FIELDS)


def warmup_steps(config, num_steps: int) -> int:
  """`optim.warmup_steps`, capped at `optim.max_warmup_fraction` of the run.

  So a short run (a smoke test, `--config.train.num_steps=200`) is not all
  warmup; the cap is logged by the trainer when it applies.
  """
  optim = config.optim
  cap = int(optim.get('max_warmup_fraction', 1.0) * num_steps)
  return max(0, min(optim.warmup_steps, cap, num_steps - 1))


def learning_rate_schedule(config, num_steps: int) -> optax.Schedule:
  """0 -> optim.learning_rate over the warmup, then cosine to 0 at num_steps."""
  warmup = warmup_steps(config, num_steps)
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=config.optim.learning_rate,
    warmup_steps=warmup,
    decay_steps=max(num_steps, warmup + 1),
    end_value=0.0,
  )


def _decay_mask(params):
  """Weight decay on matrices (kernels, embeddings), not on biases or norms."""
  return jax.tree.map(lambda x: x.ndim > 1, params)


def create(config, num_steps: int) -> Tuple[optax.GradientTransformation, optax.Schedule, int]:
  """(`create_optimizer`, `learning_rate_schedule`, `warmup_steps`) of `config`."""
  return (
    create_optimizer(config, num_steps),
    learning_rate_schedule(config, num_steps),
    warmup_steps(config, num_steps),
  )


def create_optimizer(config, num_steps: int) -> optax.GradientTransformation:
  """The optax transformation of `config.optim` (LoRA: only the adapters train,
  and the clipping norm is taken over them alone)."""
  optim = config.optim
  lr = learning_rate_schedule(config, num_steps)
  chain = [optax.clip_by_global_norm(optim.grad_clip)] if optim.grad_clip > 0 else []
  if optim.name == 'adamw':
    chain.append(
      optax.adamw(lr, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay, mask=_decay_mask)
    )
  elif optim.name == 'sgd':
    chain += [
      optax.add_decayed_weights(optim.weight_decay, mask=_decay_mask),
      optax.sgd(lr, momentum=optim.b1 or None),
    ]
  else:
    raise ValueError(
      f'config.optim.name={optim.name!r} is not valid; valid choices: {", ".join(OPTIMIZERS)}'
    )
  return adapters.optimizer(config, optax.chain(*chain))

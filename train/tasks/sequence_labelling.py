"""The 'sequence_labelling' task: a token at each scored position (MQAR, any labelled sequence).

Batches hold 'inputs' `[b, n]` int tokens and 'label' `[b, k, 2]` int: the
(position, token) of each scored position, padded with (0, -100)
(`data/sequences.py`: files hold labels `[n, length]`, -100 where
a position is not scored; `sequences.scored` gathers them). The causal model
reads the inputs as they are (a label is what the position must predict, so
a language model's labels are its inputs shifted left); its vocabulary head
runs at the scored positions only, and the loss is their cross-entropy.
Metrics, per scored position: 'loss' (cross-entropy, nats) and 'accuracy'
(argmax equals the label).
"""

import jax.numpy as jnp
import optax

from data import sequences
from train.tasks import base


def loss_and_metrics(model, params, batch, *, train: bool, rngs=None):
  """batch: 'inputs' `[b, n]`, 'label' `[b, k, 2]` (position, token; token -100: none),
  'mask' `[b]` -> (mean loss per scored position, metric sums); 'count' is the number of
  scored positions."""
  positions, labels = batch['label'][..., 0], batch['label'][..., 1]
  logits = model.apply(
    {'params': params}, batch['inputs'], train=train, rngs=rngs, positions=positions
  )  # [b, k, vocab]
  scored = labels != sequences.IGNORE
  weights = scored * batch['mask'].astype(jnp.float32)[:, None]
  safe = jnp.where(scored, labels, 0)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, safe)  # [b, k]
  count = weights.sum()
  metrics = {
    'loss': (losses * weights).sum(),
    'accuracy': ((jnp.argmax(logits, -1) == safe) * weights).sum(),
    'count': count,
  }
  return metrics['loss'] / jnp.maximum(count, 1.0), metrics


TASK = base.Task(name='sequence_labelling', loss_and_metrics=loss_and_metrics, reads=('sequence',))

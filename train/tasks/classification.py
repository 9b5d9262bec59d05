"""The 'classification' task: softmax cross-entropy, accuracy, top-5 accuracy."""

import jax.numpy as jnp
import optax

from train.tasks import base


def loss_and_metrics(model, params, batch, *, train: bool, rngs=None):
  """batch: 'inputs', 'label' `[b]` int, 'mask' `[b]` float -> (mean loss, metric sums).

  'top5_accuracy' is reported when there are more than 5 classes.
  """
  logits = model.apply({'params': params}, batch['inputs'], train=train, rngs=rngs)
  labels, weights = batch['label'], batch['mask'].astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  count = weights.sum()
  metrics = {
    'loss': (losses * weights).sum(),
    'accuracy': ((jnp.argmax(logits, -1) == labels) * weights).sum(),
    'count': count,
  }
  if logits.shape[-1] > 5:
    top5 = jnp.argsort(logits, axis=-1)[:, -5:]
    metrics['top5_accuracy'] = ((top5 == labels[:, None]).any(-1) * weights).sum()
  return metrics['loss'] / jnp.maximum(count, 1.0), metrics


TASK = base.Task(name='classification', loss_and_metrics=loss_and_metrics)

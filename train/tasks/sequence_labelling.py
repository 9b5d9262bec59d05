"""The 'sequence_labelling' task: a token at each scored position (MQAR, any labelled sequence).

Batches hold 'inputs' `[b, n]` int tokens and 'label' `[b, n]` int, -100 where a
position is not scored (`train/input_pipeline/sequences.py`). The causal model
reads the inputs as they are (a label is what the position must predict, so
a language model's labels are its inputs shifted left) and is trained with
cross-entropy on the scored positions only. Metrics, per scored position:
'loss' (cross-entropy, nats) and 'accuracy' (argmax equals the label).
"""
import jax.numpy as jnp
import optax

from train.input_pipeline import sequences
from train.tasks import base


def loss_and_metrics(model, params, batch, *, train: bool, rngs=None):
  """batch: 'inputs' `[b, n]`, 'label' `[b, n]` (-100: not scored), 'mask' `[b]` ->
  (mean loss per scored position, metric sums); 'count' is the number of scored positions."""
  logits = model.apply({'params': params}, batch['inputs'], train=train, rngs=rngs)
  labels = batch['label']
  scored = labels != sequences.IGNORE
  weights = scored * batch['mask'].astype(jnp.float32)[:, None]
  safe = jnp.where(scored, labels, 0)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, safe)  # [b, n]
  count = weights.sum()
  metrics = {
      'loss': (losses * weights).sum(),
      'accuracy': ((jnp.argmax(logits, -1) == safe) * weights).sum(),
      'count': count,
  }
  return metrics['loss'] / jnp.maximum(count, 1.0), metrics


TASK = base.Task(name='sequence_labelling', loss_and_metrics=loss_and_metrics,
                 reads=('sequence',))

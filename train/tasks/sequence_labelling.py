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

Packed rows (`data/packing.py`) also hold 'segment_ids' `[b, n]` (0: padding): the
model reads each document alone (`logits_at`: segment ids, positions restarting at 0 in
each document), and only real tokens count: a position scored at padding, which the data
checks refuse, would be dropped here too. 'tokens', the real tokens the model read (the
rate the trainer prints as tok/s), is the non-padding tokens of packed rows, else the
whole rows.
"""

import jax.numpy as jnp
import optax

from data import sequences
from train.tasks import base


def logits_at(model, params, batch, scored, *, train: bool, rngs=None):
  """The causal model's logits `[b, k, vocab]` at the positions `scored` `[b, k]` of
  batch['inputs'].

  The one place a task calls the model: with 'segment_ids' in the batch (packed rows),
  the model gets them too, so that no token reads another document; its positions
  within each document default to `ops.segments.positions(segment_ids)` in the model.
  """
  variables = {'params': params}
  segment_ids = batch.get('segment_ids')
  extra = {} if segment_ids is None else {'segment_ids': segment_ids}
  return model.apply(variables, batch['inputs'], train=train, rngs=rngs, positions=scored, **extra)


def weights(batch, scored, labels):
  """float32 `[b, k]`: 1 where a label is scored on a real token of a real row, else 0."""
  keep = (labels != sequences.IGNORE) & (batch['mask'][:, None] > 0)
  segment_ids = batch.get('segment_ids')
  if segment_ids is not None:  # never a padding token (segment 0)
    keep &= jnp.take_along_axis(segment_ids, scored, axis=1) != 0
  return keep.astype(jnp.float32)


def real_tokens(batch):
  """The real tokens of a batch's real rows: the non-padding ones of packed rows
  (segment id != 0), else every token of each row."""
  mask = batch['mask'].astype(jnp.float32)
  segment_ids = batch.get('segment_ids')
  if segment_ids is None:
    return mask.sum() * batch['inputs'].shape[-1]
  return ((segment_ids != 0) * mask[:, None]).sum()


def loss_and_metrics(model, params, batch, *, train: bool, rngs=None):
  """batch: 'inputs' `[b, n]`, 'label' `[b, k, 2]` (position, token; token -100: none),
  'mask' `[b]`, for packed rows 'segment_ids' `[b, n]` -> (mean loss per scored position,
  metric sums); 'count' is the number of scored positions, 'tokens' the real tokens."""
  scored, labels = batch['label'][..., 0], batch['label'][..., 1]
  logits = logits_at(model, params, batch, scored, train=train, rngs=rngs)  # [b, k, vocab]
  weight = weights(batch, scored, labels)
  safe = jnp.where(weight > 0, labels, 0)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, safe)  # [b, k]
  count = weight.sum()
  metrics = {
    'loss': (losses * weight).sum(),
    'accuracy': ((jnp.argmax(logits, -1) == safe) * weight).sum(),
    'count': count,
    'tokens': real_tokens(batch),
  }
  return metrics['loss'] / jnp.maximum(count, 1.0), metrics


TASK = base.Task(name='sequence_labelling', loss_and_metrics=loss_and_metrics, reads=('sequence',))

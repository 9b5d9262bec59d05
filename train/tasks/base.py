"""What a task is: how a batch becomes a loss and metrics, independent of the loop.

Metric convention: `loss_and_metrics` returns the scalar loss to differentiate
and a dict of *sums* over the batch's real examples (or tokens) plus 'count',
the sum of the weights; the trainer adds them up over steps, batches and
devices and reports `metric / count`. Padding rows have weight 0.
"""

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

Metrics = Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Task:
  """One kind of training objective.

  Attributes:
    name: `config.task` value.
    loss_and_metrics: `loss_and_metrics(model, params, batch, *, train, rngs)
      -> (loss, metric sums)`, with `rngs` the dict of PRNG keys for `apply`
      ('dropout', 'features') or None in evaluation.
    write_outputs: optional `write_outputs(config, model, params, workdir) ->
      {name: path}`, called on process 0 after training and in evaluation
      (pixel_lm: sample PNGs).
    reads: the inputs it scores (`data.input_kind`).
  """

  name: str
  loss_and_metrics: Callable[..., Tuple[Any, Metrics]]
  write_outputs: Optional[Callable[..., Dict[str, str]]] = None
  reads: Tuple[str, ...] = ('image', 'text', 'text_pair', 'tokens', 'pixels')

"""A plain MLP classifier (the base model of the LoRA study)."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp


class MLP(nn.Module):
  """Flatten -> `depth` x (Dense(width) -> ReLU) -> Dense(num_classes) 'head'.

  784-64-64-10 on MNIST (depth 2, width 64) has 55,050 parameters. Layers:
  'hidden_0', ..., 'head'.
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

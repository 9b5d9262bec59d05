r"""A small vision transformer in Flax NNX, with any mechanism and projection.

    python -m examples.nnx_vit --mechanism=linear --projection=efficient --steps=400

Trains on scikit-learn's 8x8 digits (shipped with scikit-learn: no download),
holding out a fixed 20% for validation, and prints the validation accuracy.
The attention layer is `efficient_attn.nnx.MultiHeadAttention`; everything
else is plain NNX, so this file is a template for putting the library into an
NNX model of your own.
"""

from typing import Any, Mapping, Optional

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import efficient_attn.nnx as ean
from train import api


class Block(nnx.Module):
  """Pre-norm transformer block: x + attention(LN x), then x + MLP(LN x)."""

  def __init__(
    self,
    d_model: int,
    heads: int,
    length: int,
    *,
    mechanism: str,
    projection: str,
    options: Optional[Mapping[str, Any]],
    tag,
    rngs: nnx.Rngs,
  ):
    self.norm1 = nnx.LayerNorm(d_model, rngs=rngs)
    self.attention = ean.MultiHeadAttention(
      heads,
      d_model,
      mechanism=mechanism,
      projection=projection,
      options=options,
      max_length=length,
      tag=tag,
      rngs=rngs,
    )
    self.norm2 = nnx.LayerNorm(d_model, rngs=rngs)
    self.mlp_in = nnx.Linear(d_model, 2 * d_model, rngs=rngs)
    self.mlp_out = nnx.Linear(2 * d_model, d_model, rngs=rngs)

  def __call__(self, x):
    x = x + self.attention(self.norm1(x))
    return x + self.mlp_out(nnx.gelu(self.mlp_in(self.norm2(x))))


class ViT(nnx.Module):
  """Images `[batch, height, width, channels]` -> logits `[batch, num_classes]`."""

  def __init__(
    self,
    *,
    image_size: int = 8,
    channels: int = 1,
    patch: int = 2,
    d_model: int = 32,
    heads: int = 4,
    depth: int = 2,
    num_classes: int = 10,
    mechanism: str = 'softmax',
    projection: str = 'standard',
    options: Optional[Mapping[str, Any]] = None,
    rngs: nnx.Rngs,
  ):
    if image_size % patch:
      raise ValueError(f'patch={patch} must divide image_size={image_size}')
    self.patch = patch
    length = (image_size // patch) ** 2
    self.embed = nnx.Linear(patch * patch * channels, d_model, rngs=rngs)
    self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, length, d_model)))
    # Each layer gets its own tag, so mechanisms with a fixed random draw
    # (performer, rfa) draw differently in each layer, as the Linen models do.
    self.blocks = nnx.List(
      [
        Block(
          d_model,
          heads,
          length,
          mechanism=mechanism,
          projection=projection,
          options=options,
          tag=(f'block_{i}', 'attention', 'mechanism'),
          rngs=rngs,
        )
        for i in range(depth)
      ]
    )
    self.norm = nnx.LayerNorm(d_model, rngs=rngs)
    self.head = nnx.Linear(d_model, num_classes, rngs=rngs)

  def __call__(self, images):
    b, h, w, c = images.shape
    p = self.patch
    patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    x = self.embed(patches.reshape(b, (h // p) * (w // p), p * p * c)) + self.position[...]
    for block in self.blocks:
      x = block(x)
    return self.head(self.norm(x).mean(axis=1))


def loss_fn(model: ViT, images, labels):
  logits = model(images)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), logits


@nnx.jit
def train_step(model: ViT, optimizer: nnx.Optimizer, images, labels):
  (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, images, labels)
  optimizer.update(model, grads)
  return loss


@nnx.jit
def accuracy(model: ViT, images, labels):
  return jnp.mean(jnp.argmax(model(images), -1) == labels)


def digits(seed: int = 0):
  """scikit-learn's 8x8 digits in [0, 1], `[n, 8, 8, 1]`: (train, validation) splits."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top

  data = datasets.load_digits()
  images = (data.images / 16.0).astype(np.float32)[..., None]
  order = np.random.default_rng(seed).permutation(len(images))
  cut = len(images) * 4 // 5
  train, val = order[:cut], order[cut:]
  return (images[train], data.target[train]), (images[val], data.target[val])


def train(
  model: ViT,
  images,
  labels,
  *,
  steps: int,
  batch: int = 64,
  learning_rate: float = 3e-3,
  seed: int = 0,
):
  """Adam on random batches; returns the losses."""
  optimizer = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)
  rng = np.random.default_rng(seed)
  losses = []
  for _ in range(steps):
    idx = rng.integers(0, len(images), batch)
    losses.append(float(train_step(model, optimizer, images[idx], labels[idx])))
  return losses


_MECHANISM = flags.DEFINE_string('mechanism', 'softmax', 'attention mechanism')
_PROJECTION = flags.DEFINE_string('projection', 'standard', 'projection scheme')
_STEPS = flags.DEFINE_integer('steps', 400, 'training steps')


def main(argv):
  del argv
  api.quiet_logs(flags.FLAGS['verbosity'].present)
  (x, y), (xv, yv) = digits()
  model = ViT(mechanism=_MECHANISM.value, projection=_PROJECTION.value, rngs=nnx.Rngs(0))
  losses = train(model, x, y, steps=_STEPS.value)
  print(
    f'{_MECHANISM.value} x {_PROJECTION.value}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, '
    f'validation accuracy {float(accuracy(model, xv, yv)):.3f} on {len(yv)} digits'
  )


if __name__ == '__main__':
  app.run(main)

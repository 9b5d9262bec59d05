"""The 'pixel_lm' task: autoregressive pixel generation (Katharopoulos et al. 2020).

Images arrive as tokens `[b, h*w]` int32 in 0..255 (`dataset.pixels_as_tokens`);
the causal model reads `shift_right(pixels, start_token)` and predicts every
pixel from the ones before it, a 256-way softmax per pixel. Metrics (per
pixel unless said): 'loss' (cross-entropy, nats), 'bits_per_dim' (loss / ln 2),
'nll' (nats per image: the sum over its pixels) and 'accuracy' (argmax equals
the pixel). After training, and in `--mode=eval`, `write_outputs` saves
`samples.png` (unconditional samples) and `samples_completion.png`
(test images, their occluded top halves, the model's completions).
"""

import math
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np
import optax

import data
from efficient_attn.models.causal import shift_right
from train import adapters
from train import modeling
from train import samples
from train.tasks import base

SAMPLE_DEFAULTS = dict(num_samples=16, num_completions=8, rows=0, temperature=1.0, seed=0)


def loss_and_metrics(model, params, batch, *, train: bool, rngs=None):
  """batch: 'inputs' `[b, n]` int pixels, 'mask' `[b]` -> (mean loss per pixel, metric sums).

  'count' is the number of real pixels (real images x n).
  """
  pixels = batch['inputs']
  num_pixels = pixels.shape[1]
  logits = model.apply(
    {'params': params}, shift_right(pixels, modeling.PIXEL_LEVELS), train=train, rngs=rngs
  )
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, pixels)  # [b, n]
  weights = jnp.broadcast_to(batch['mask'].astype(jnp.float32)[:, None], losses.shape)
  loss_sum = (losses * weights).sum()
  count = weights.sum()
  metrics = {
    'loss': loss_sum,
    'bits_per_dim': loss_sum / math.log(2.0),
    'nll': loss_sum * num_pixels,  # / count = mean nats per image
    'accuracy': ((jnp.argmax(logits, -1) == pixels) * weights).sum(),
    'count': count,
  }
  return loss_sum / jnp.maximum(count, 1.0), metrics


def write_outputs(config, model, params, workdir: str) -> Dict[str, str]:
  """Sample grid and occluded completions of test images as PNGs in `workdir`.

  Runs on this process's devices only (params are fetched to the host first).
  """
  settings = {**SAMPLE_DEFAULTS, **(config.get('sample') or {})}
  model, params = adapters.unwrap(config, model, jax.device_get(params))
  side = config.dataset.image_size
  images = None
  if settings['num_completions'] > 0:
    tokens = data.get_eval_batch(config)['inputs'][: settings['num_completions']]
    images = np.asarray(tokens).reshape((-1, side, side))
  return samples.write_samples(
    model,
    params,
    jax.random.key(settings['seed']),
    workdir,
    image_shape=(side, side),
    num_samples=settings['num_samples'],
    temperature=settings['temperature'],
    images=images,
    rows=settings['rows'] or None,
  )


TASK = base.Task(
  name='pixel_lm', loss_and_metrics=loss_and_metrics, write_outputs=write_outputs, reads=('pixels',)
)

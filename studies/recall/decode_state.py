"""The decode state of a recall model: the bytes of one sequence's decoding cache.

The key/value cache of softmax and local attention, the recurrent state of the others, plus
the position counters, every layer (`benchmarks.generation.cache_bytes`), built from a
config without its weights.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from benchmarks.generation import cache_bytes
from efficient_attn.layers import hybrid
from train import api


def mqar_config(arg: str):
  """configs/mqar.py's config for `arg` ('mechanism,key=value,...')."""
  return api.config_function('configs/mqar.py')(arg)


def state_bytes(config) -> Optional[int]:
  """Bytes of one sequence's decode cache for the model of `config` (no weights read), or
  None for a mechanism without a decoding form."""
  if not all(d.decode for d in hybrid.declarations(config.attention.mechanism)):
    return None
  model = api.create_model(config)
  params = jax.eval_shape(
    lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, config.dataset.max_length), jnp.int32))[
      'params'
    ]
  )
  return cache_bytes(model, params)

"""Experiment workdirs as analysis inputs: models, parameters, eval inputs, captured q/k/v.

A *source* is what the checkpoint-based tools (approx_error, spectrum) analyse:
a trained workdir (through `train.api.load` and the input
pipeline's `get_eval_batch`), or 'random:<mechanism>' (a freshly initialised
small ViT on random 8x8 images: an untrained baseline, and what the tests use).
"""

import dataclasses
import json
import re
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from etils import epath
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

RANDOM_PREFIX = 'random:'


@dataclasses.dataclass
class Source:
  """A model with parameters and a batch of its inputs.

  Attributes:
    name: the workdir path or 'random:<mechanism>'.
    model: a Flax module whose attention layers are `efficient_attn.MultiHeadAttention`.
    params: its parameters.
    inputs: a batch of model inputs (images `[b, h, w, c]` or tokens `[b, n]`).
    info: dataset / mechanism / projection / heads / d_model, for labels.
  """

  name: str
  model: Any
  params: Any
  inputs: Any
  info: Dict[str, Any]


def load_source(name: str, num_examples: int = 8, seed: int = 0) -> Source:
  """A workdir or 'random:<mechanism>' (see module docstring)."""
  if name.startswith(RANDOM_PREFIX):
    return random_vit(name[len(RANDOM_PREFIX) :] or 'softmax', num_examples, seed)
  if not epath.Path(name).is_dir():
    raise FileNotFoundError(f'no such workdir {name!r} (or use random:<mechanism>)')
  try:
    import data  # pylint: disable=g-import-not-at-top
    from train import api  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise RuntimeError(f'reading a checkpoint needs the experiment code (train/): {e}') from e
  config, model, params = api.load(name)
  batch = data.get_eval_batch(config)
  inputs = np.asarray(batch['inputs'])
  if 'mask' in batch:  # drop padding rows of a short last batch
    inputs = inputs[np.asarray(batch['mask']) > 0]
  return Source(name, model, params, jnp.asarray(inputs[:num_examples]), config_info(config))


def config_info(config) -> Dict[str, Any]:
  """dataset / mechanism / projection / heads / d_model from an experiment config."""
  get = lambda group, field, default=None: (config.get(group) or {}).get(field, default)
  return dict(
    dataset=get('dataset', 'name'),
    mechanism=get('attention', 'mechanism'),
    projection=get('attention', 'projection'),
    heads=get('model', 'num_heads'),
    d_model=get('model', 'd_model'),
  )


def random_vit(
  mechanism: str = 'softmax',
  num_examples: int = 8,
  seed: int = 0,
  projection: str = 'standard',
  image_size: int = 8,
  d_model: int = 32,
  depth: int = 2,
  num_heads: int = 4,
) -> Source:
  """An untrained ViT (patch 2, cls token) on random images `[b, 8, 8, 1]`."""
  from efficient_attn import models  # pylint: disable=g-import-not-at-top

  model = models.ViT(
    models.TransformerConfig(
      d_model=d_model,
      depth=depth,
      num_heads=num_heads,
      mlp_dim=2 * d_model,
      mechanism=mechanism,
      projection=projection,
    ),
    num_classes=10,
    patch_size=2,
  )
  key_init, key_x = jax.random.split(jax.random.PRNGKey(seed))
  inputs = jax.random.normal(key_x, (num_examples, image_size, image_size, 1))
  params = jax.jit(model.init)(key_init, inputs)['params']
  info = dict(
    dataset='random', mechanism=mechanism, projection=projection, heads=num_heads, d_model=d_model
  )
  return Source(RANDOM_PREFIX + mechanism, model, params, inputs, info)


def capture_qkv(source: Source) -> List[Tuple[str, Tuple[jnp.ndarray, ...]]]:
  """[(layer path, (q, k, v))] after projection, for every attention layer, in order.

  Uses the `('attention_qkv', 'qkv')` values that `MultiHeadAttention` sows;
  q, k, v are `[batch, length, heads, head_dim]`.
  """
  apply = jax.jit(
    lambda params, x: source.model.apply({'params': params}, x, mutable=['attention_qkv'])[1]
  )
  state = apply(source.params, source.inputs)
  flat = traverse_util.flatten_dict(dict(state.get('attention_qkv', {})))
  layers = []
  for path, value in flat.items():
    if path[-1] == 'qkv':
      for i, qkv in enumerate(value):  # one entry per call of the layer
        name = '/'.join(path[:-1]) + (f'#{i}' if len(value) > 1 else '')
        layers.append((name, tuple(qkv)))
  if not layers:
    raise ValueError(
      f'{source.name}: the model sowed no (q, k, v); its attention layers '
      'must be efficient_attn.MultiHeadAttention'
    )
  return sorted(layers, key=lambda item: _natural_key(item[0]))


def _natural_key(text: str):
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', text)]


def mean_spread(values: Sequence[float]) -> Tuple[float, float]:
  """(mean, spread) of one measure over seeds; the spread is half the range, as every
  results table here reports it."""
  return statistics.mean(values), (max(values) - min(values)) / 2


def read_json(path) -> Optional[Any]:
  """A JSON file (local or gs://, through epath), or None if it is absent."""
  path = epath.Path(path)
  return json.loads(path.read_text()) if path.exists() else None


def read_report(path) -> Any:
  """An earlier report's .json, parsed; a file that is missing, unreadable or not JSON is a
  one-line exit naming it (the caller checks the shape)."""
  try:
    data = read_json(path)
  except json.JSONDecodeError as e:
    raise SystemExit(f'{path}: not a report JSON (it does not parse: {e})') from None
  except OSError as e:  # a folder named .json, a file it may not read
    raise SystemExit(f'{path}: not a report JSON (it cannot be read: {e.strerror})') from None
  if data is None:
    raise SystemExit(f'{path}: not a report JSON (no such file)')
  return data


def read_jsonl(path) -> List[Dict[str, Any]]:
  """One JSON object per line; a torn last line (a run still writing) is skipped."""
  path = epath.Path(path)
  if not path.exists():
    return []
  rows = []
  for line in path.read_text().splitlines():
    line = line.strip()
    if not line:
      continue
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return rows

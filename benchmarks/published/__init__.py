"""Published peers, run as published: the measuring instruments of `benchmarks.peers`.

Two published implementations are timed unchanged beside the library:

  flax's softmax attention   `flax.linen.dot_product_attention` (installed with flax).
  google-research's FAVOR+   `performer/fast_attention/jax/fast_attention.py` of
                             github.com/google-research/google-research at commit
                             `FAST_ATTENTION['commit']` (Apache-2.0, Copyright 2021 The
                             Google Research Authors), loaded by `fast_attention()`.

The FAVOR+ file is not part of this repository: third-party code stays out of its
commits. It is read, byte for byte as published, from `FAST_ATTENTION['local']`
(git-ignored) or from the file named by the environment variable
`EFFICIENT_ATTN_FAST_ATTENTION`, and refused unless its sha256 is
`FAST_ATTENTION['sha256']`, so what runs is exactly the published file. To get it:

    mkdir -p benchmarks/published/third_party/performer_fast_attention_jax
    curl -o benchmarks/published/third_party/performer_fast_attention_jax/fast_attention.py \
      https://raw.githubusercontent.com/google-research/google-research/<commit>/performer/fast_attention/jax/fast_attention.py

It imports `gin` only to register functions; where gin-config is missing,
`gin_shim` (ours, a separate file) stands in for it. Nothing else is changed.

LRA's attention modules (google-research/long-range-arena) are written against
`flax.nn`, which flax removed (0.4); they cannot run unchanged with the flax this
library uses, so `benchmarks.peer_algorithms` keeps our copies of their recipes
(Linformer, and the FAVOR+ recipe beside the published file).
"""

import hashlib
import importlib.util
import os
import sys
from typing import Any, Callable

import jax

from benchmarks.published import gin_shim

_HERE = os.path.dirname(os.path.abspath(__file__))

FAST_ATTENTION = dict(
  repo='google-research/google-research',
  path='performer/fast_attention/jax/fast_attention.py',
  commit='0c1bbe5fc971a1de1a427debc814e66ab4f1e7fa',
  license='Apache-2.0',
  sha256='f3acf4a077a3f95d6c10203d306b798e2d3ec9dd450e635637ddf52b14d70abd',
  local=os.path.join(_HERE, 'third_party', 'performer_fast_attention_jax', 'fast_attention.py'),
  env='EFFICIENT_ATTN_FAST_ATTENTION',
)

_MODULE = 'published_performer_fast_attention'


def fast_attention_path() -> str:
  return os.environ.get(FAST_ATTENTION['env']) or FAST_ATTENTION['local']


def fast_attention():
  """google-research's `fast_attention` module, imported from the unchanged published file.

  Raises FileNotFoundError (where to put it) when absent, ValueError when the file's
  sha256 is not the published one's.
  """
  if _MODULE in sys.modules:
    return sys.modules[_MODULE]
  path = fast_attention_path()
  if not os.path.isfile(path):
    raise FileNotFoundError(
      f"google-research's fast_attention.py is not at {path}: fetch "
      f"{FAST_ATTENTION['path']} of {FAST_ATTENTION['repo']} at {FAST_ATTENTION['commit']} "
      f"there (or name it in ${FAST_ATTENTION['env']})"
    )
  with open(path, 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  if digest != FAST_ATTENTION['sha256']:
    raise ValueError(
      f'{path} has sha256 {digest}, not the published file\'s '
      f"{FAST_ATTENTION['sha256']} ({FAST_ATTENTION['repo']} at "
      f"{FAST_ATTENTION['commit']})"
    )
  gin_shim.install()
  spec = importlib.util.spec_from_file_location(_MODULE, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  sys.modules[_MODULE] = module
  return module


def favor(head_dim: int, num_features: int, causal: bool) -> Callable[..., Any]:
  """google-research's FAVOR+ `f(q, k, v)`, q, k, v `[batch, length, heads, head_dim]`.

  `make_fast_softmax_attention` with its defaults (orthogonal features, renormalised,
  stabiliser 1e-6, its own projection drawn from PRNGKey(0)) except
  `redraw_features=False`: the library also keeps one projection per layer, and a
  redraw would add a QR decomposition to every timed call.
  """
  attend = fast_attention().make_fast_softmax_attention(
    head_dim, nb_features=num_features, redraw_features=False, unidirectional=causal
  )
  return lambda q, k, v: attend(q, k, v)


def flax_softmax(causal: bool) -> Callable[..., Any]:
  """`flax.linen.dot_product_attention` `f(q, k, v)` (causal: `flax.linen.make_causal_mask`)."""
  from flax import linen as nn  # pylint: disable=g-import-not-at-top

  def attend(q, k, v):
    mask = None
    if causal:
      mask = nn.make_causal_mask(jax.numpy.ones(q.shape[:2], jax.numpy.int32))
    return nn.dot_product_attention(q, k, v, mask=mask)

  return attend

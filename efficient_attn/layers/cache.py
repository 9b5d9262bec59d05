"""The decoding cache of a multi-head attention layer, whichever Flax API holds it.

The Linen layer keeps it in the 'cache' collection, the NNX layer as `nnx.Cache`
attributes; both create it with `init_cache` and advance it with `decode_step`, under
flax's names where flax has the same thing (`CACHE_NAMES`). The mechanism's decoding
form (`efficient_attn.layers.decoding`) is what a step runs.
"""

from typing import Any, Callable, Dict, Optional

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.layers import decoding
from efficient_attn.ops import rotary
from efficient_attn.ops import traced_checks

CACHE_NAMES = ('cache_index', 'cached_key', 'cached_value', 'cached_state', 'cached_raw_values')


def init_cache(
  form: decoding.DecodeForm,
  *,
  batch: int,
  length: int,
  heads: int,
  head_dim: int,
  dtype: Any,
  super_values: bool,
  v_dim: Optional[int] = None,
) -> Dict[str, Any]:
  """An empty decoding cache for `length` tokens of `heads` (`state_heads`) heads, keys of
  `head_dim` and values of `v_dim` (None: head_dim) features (`HeadLayout`'s qk_dim, v_dim).

  'cache_index' (the next position); the mechanism's state: 'cached_key' and
  'cached_value' `[batch, slots, heads, head_dim]` for a key/value cache (as
  flax; slots = length, or min(length, window) for a sliding window's ring buffer,
  `decoding.window_kv_cache`), 'cached_state' for a recurrent state; and, for the super projection,
  'cached_raw_values' (the raw values its lower-triangular W_A mixes).
  """
  v_dim = v_dim or head_dim
  cache = {'cache_index': jnp.zeros((), jnp.int32)}
  state = form.init(batch, length, heads, head_dim, v_dim, dtype)
  if isinstance(state, decoding.KVCache):
    cache['cached_key'], cache['cached_value'] = state
  else:
    cache['cached_state'] = state
  if super_values:
    cache['cached_raw_values'] = jnp.zeros((batch, length, heads, v_dim), dtype)
  return cache


def decode_step(
  form: decoding.DecodeForm,
  cache: Dict[str, Any],
  q,
  k,
  v,
  *,
  rotate_scores: bool,
  align_at: Optional[Callable[..., Any]] = None,
):
  """One token `[batch, 1, heads, dim]` through the cache: (new cache, out `[batch, 1, heads, dv]`).

  Raises ValueError when `batch` is not the cache's.

  Args:
    form: the mechanism's `decoding.DecodeForm`.
    cache: from `init_cache`.
    rotate_scores: rotary positions on q and k (keys are cached rotated).
    align_at: the super projection's `align(values, index=i)`; None otherwise.
  """
  cached = [
    x for name, value in cache.items() if name != 'cache_index' for x in jax.tree.leaves(value)
  ]  # every one [batch, ...]
  if cached and q.shape[0] != cached[0].shape[0]:
    raise ValueError(
      f'a decoding step of batch {q.shape[0]} does not fit the cache, made '
      f'for batch {cached[0].shape[0]} (batch axes flattened); decode with '
      f'the batch the cache was created with'
    )
  i = cache['cache_index']
  cache = dict(cache)
  if align_at is not None:
    values = cache['cached_raw_values']
    traced_checks.runtime_check(
      i < values.shape[1],
      'decoding step at position {} is past the super projection\'s context of {} tokens',
      i,
      values.shape[1],
    )
    values = lax.dynamic_update_slice_in_dim(values, v.astype(values.dtype), i, axis=1)
    cache['cached_raw_values'] = values
    v = align_at(values, index=i)
  if rotate_scores and 'cached_key' in cache:  # a recurrent step rotates in run_mechanism
    q, k = rotary.rotate(q, i), rotary.rotate(k, i)
  if 'cached_key' in cache:
    state, x = form.step(decoding.KVCache(cache['cached_key'], cache['cached_value']), q, k, v, i)
    cache['cached_key'], cache['cached_value'] = state
  else:
    cache['cached_state'], x = form.step(cache['cached_state'], q, k, v, i)
  cache['cache_index'] = i + 1
  return cache, x

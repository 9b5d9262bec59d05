"""NaN and Inf in tokens that an output may not read: the layer keeps them out.

A mechanism that hides a token from an output by giving it zero weight still multiplies
that weight by the token's value in a dense matmul, and 0 x NaN is NaN. Two cases reach
the layer:

  * padding (`zero_unused_keys`): a key that the mask hides from every query is set to 0
    before the mechanism runs, so it holds nothing to carry;
  * the future, in a causal call (`guard_future`): token t is read by the outputs at t and
    after, so it cannot be zeroed. The mechanism runs on inputs with every non-finite
    entry set to 0; then every output at or after the first real token of its document
    that held one is NaN. The outputs before it are exact: they never read the token.
    After it the result is NaN where the exact one is NaN or Inf; in a mechanism that
    reads a window only, it is NaN also where the exact one is finite (loud, never
    silently wrong). Every causal mechanism needs it: each multiplies some zero weight,
    gate or decay by a later token's value in its chunked or dense form.

Shapes: q, k, v `[batch, length, heads, dim]`; inputs `[batch, length, features]`;
mask `[batch, length]` or flax's `[batch, heads|1, q|1, length]`; documents
`[batch, length]` (`ops.segments.document_index`).
"""

import functools
import operator
from typing import Optional, Tuple

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import masking


def zero_unused_keys(mask, k, v):
  """k and v with 0 for every key that `mask` hides from every query and head.

  Such a key (padding) moves no output by its weight, but a mechanism that multiplies
  its zero weight by the key's value (a dense matmul: 0 x NaN is NaN), or mixes keys
  before masking, would carry a NaN or Inf it holds into real outputs.
  mask: None, key padding `[batch, kv_length]` or `[batch, heads|1, q_length|1,
  kv_length]`; k, v `[batch, kv_length, heads, dim]`.
  """
  if mask is None:
    return k, v
  used = masking.key_padding_from_mask(mask, *k.shape[:2])[:, :, None, None]
  return jnp.where(used, k, 0), jnp.where(used, v, 0)


def finite_or_zero(x):
  """x with 0 in place of every NaN or Inf entry."""
  return jnp.where(jnp.isfinite(x), x, 0)


def _finite_tokens(x) -> jnp.ndarray:
  """`[batch, length]` bool: every entry of the token (`x[b, t]`) is finite."""
  return jnp.all(jnp.isfinite(x), axis=tuple(range(2, x.ndim)))


def after_non_finite(bad, documents: Optional[jnp.ndarray] = None):
  """`[batch, length]` bool: a `bad` token at or before t in t's own document.

  bad `[batch, length]` bool; documents: each token's document index (None: one
  document per row). Documents are runs, so the count of bad tokens before t's run
  began is the running count's value at the run's start.
  """
  count = jnp.cumsum(bad, axis=-1, dtype=jnp.int32)
  if documents is None:
    return count > 0
  before = count - bad.astype(jnp.int32)
  starts = jnp.concatenate(
    [jnp.ones_like(documents[:, :1], bool), documents[:, 1:] != documents[:, :-1]], axis=-1
  )
  at_start = lax.cummax(jnp.where(starts, before, 0), axis=1)
  return count - at_start > 0


def guard_future(
  q, k, v, inputs, *, mask, documents
) -> Tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray, Optional[jnp.ndarray], jnp.ndarray]:
  """(q, k, v, inputs) with non-finite entries set to 0, and `poisoned` `[batch, length]`:
  the outputs at or after a real token of their document that held one (`poison` sets
  them to NaN). A padded token (hidden by `mask` from every query) poisons nothing.
  inputs may be None (a mechanism that reads only q, k and v)."""
  arrays = [x for x in (q, k, v, inputs) if x is not None]
  bad = ~functools.reduce(operator.and_, map(_finite_tokens, arrays))
  used = masking.key_padding_from_mask(mask, *k.shape[:2])
  if used is not None:
    bad = bad & used
  poisoned = after_non_finite(bad, documents)
  q, k, v = map(finite_or_zero, (q, k, v))
  return q, k, v, None if inputs is None else finite_or_zero(inputs), poisoned


def poison(out, poisoned, *, axis: int = 1):
  """`out` with NaN where `poisoned` `[batch, length]` (the length on `out`'s `axis`)."""
  shape = [1] * out.ndim
  shape[0], shape[axis] = poisoned.shape
  return jnp.where(poisoned.reshape(shape), jnp.array(jnp.nan, out.dtype), out)

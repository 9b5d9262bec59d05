"""Runs a kernel mechanism with each (batch, head) pair as its own batch row."""

import jax
from jax import lax
import jax.numpy as jnp

# Whether a kernel mechanism that opts in runs its [batch * heads] rows one at a time
# (`heads_as_batch(..., loop_rows=True)`), per platform.
LOOP_ROWS = {'cpu': True, 'gpu': False, 'tpu': False}


def platform_loops_rows() -> bool:
  """`LOOP_ROWS` of the default backend: True on CPU."""
  return LOOP_ROWS.get(jax.default_backend(), False)


def heads_as_batch(
  fn, q, k, v, key_padding, return_state: bool = False, loop_rows: bool = False, **kwargs
):
  """Runs a kernel mechanism `fn` with each head as its own batch row.

  `fn(q, k, v, mask=key_padding, return_state=..., **kwargs)` sees q `[batch *
  heads, q_length, 1, d]` (k, v, key padding likewise): its feature tensors
  `[batch * heads, length, 1, f]` then feed XLA's batched matmuls with no
  transposes, which on CPU made Performer's forward + backward 1.6x faster
  (8192 tokens, 256 features). Only q, k, v and the output (d-sized) are
  transposed. The result is unfolded to `[batch, q_length, heads, dv]`, and a
  returned `KernelState` to `[batch, heads, ...]`. A `segment_ids` keyword `[batch,
  length]` (packed rows) is repeated over the heads, as the key padding is.

  With `loop_rows`, `fn` sees one row at a time (q `[1, q_length, 1, d]`) in a
  `lax.map` whose body is rematerialised (`jax.checkpoint`): only one row's
  `[length, f]` feature tensors exist at once, and the backward pass recomputes
  them instead of keeping `[batch * heads, length, f]` of them. Same values; on
  one CPU core, where those tensors' memory traffic costs more than their
  arithmetic, it made Performer's forward + backward (8 heads, 256 features,
  4096 tokens) about 1.3x faster; a GPU wants all rows at once (`LOOP_ROWS`).
  """
  b, h = q.shape[0], q.shape[2]
  if h == 1 and not loop_rows:
    return fn(q, k, v, mask=key_padding, return_state=return_state, **kwargs)

  def fold(x):
    return jnp.swapaxes(x, 1, 2).reshape(b * h, x.shape[1], 1, x.shape[-1])

  kp = None if key_padding is None else jnp.repeat(key_padding, h, axis=0)
  ids = kwargs.pop('segment_ids', None)
  ids = None if ids is None else jnp.repeat(jnp.asarray(ids), h, axis=0)
  if loop_rows:

    def row(args):
      q1, k1, v1, kp1, ids1 = (None if x is None else x[None] for x in args)
      res = fn(q1, k1, v1, mask=kp1, return_state=return_state, segment_ids=ids1, **kwargs)
      return jax.tree.map(lambda x: x[0], res)

    res = lax.map(jax.checkpoint(row, prevent_cse=False), (fold(q), fold(k), fold(v), kp, ids))
  else:
    res = fn(
      fold(q), fold(k), fold(v), mask=kp, return_state=return_state, segment_ids=ids, **kwargs
    )
  out, state = res if return_state else (res, None)
  out = jnp.swapaxes(out.reshape(b, h, q.shape[1], out.shape[-1]), 1, 2)
  if not return_state:
    return out
  return out, jax.tree.map(lambda s: s.reshape((b, h) + s.shape[2:]), state)

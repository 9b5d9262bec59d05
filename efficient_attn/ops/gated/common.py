"""What the gated recurrences' forms share: the `Cores` tuple of a recurrence's forms, the
compute and matmul dtype rules and einsum, and the chunking of `[b, h, n, ...]` arrays.

Used by the decay recurrence (`efficient_attn.ops.gated`) and the delta rule
(`efficient_attn.ops.delta`).
"""

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax.numpy as jnp

F32 = jnp.float32


class Cores(NamedTuple):
  """A recurrence's forms, one signature (docs/design.md): `scan` and `chunked` take
  (q, k, v, g=None, beta=None, *, initial_state=None, segment_ids=None, chunk_size=64) ->
  (out, final S); `step` takes (S, q_t, k_t, v_t, g_t, beta_t) -> (S, o_t); `init(batch,
  heads, dk, dv)` is the empty state; `pallas`, the chunk form's Pallas kernels
  (`efficient_attn.ops.kernels`) behind `chunked`'s signature (`pallas_form`)."""

  scan: Callable[..., Any]
  chunked: Callable[..., Any]
  step: Callable[..., Any]
  init: Callable[..., Any]
  pallas: Optional[Callable[..., Any]] = None


def pallas_form(kernel):
  """The Pallas kernels `kernel(q, k, v, log_decay, beta, *, initial_state, segment_ids,
  chunk_size)` (`efficient_attn.ops.kernels`) behind the forms' signature, where the decays
  are `g`."""

  @functools.wraps(kernel)
  def form(q, k, v, g=None, beta=None, *, initial_state=None, segment_ids=None, chunk_size=64):
    return kernel(
      q, k, v, g, beta, initial_state=initial_state, segment_ids=segment_ids, chunk_size=chunk_size
    )

  return form


def compute_dtype(*xs):
  """The dtype the forms compute in for inputs xs (None passes): float64 where one is
  float64, else float32 (bfloat16 and float16 inputs compute in float32)."""
  return functools.reduce(jnp.promote_types, (x.dtype for x in xs if x is not None), F32)


def heads_first(x, dtype=F32):
  """`[b, n, h, ...]` -> `[b, h, n, ...]` in `dtype` (float32)."""
  return jnp.swapaxes(x.astype(dtype), 1, 2)


def matmul_dtype(*xs):
  """The chunk forms' matmul operand dtype for inputs xs (q, k, v): bfloat16 where all are
  bfloat16, else their compute dtype (`compute_dtype`). Products accumulate in float32 (or
  float64) either way (`cast_einsum`), and states, decays, cumulative sums and the delta
  rule's triangular inverse stay in the compute dtype."""
  return jnp.bfloat16 if all(x.dtype == jnp.bfloat16 for x in xs) else compute_dtype(*xs)


def cast_einsum(spec: str, a, b, dtype=F32):
  """einsum(spec, a, b) with both operands cast to `dtype`, accumulated in float32 (float64
  for float64 operands)."""
  accumulate = jnp.promote_types(dtype, F32)
  return jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=accumulate)


def scale_rows(x, factor):
  """x `[..., t, d]` times factor `[..., t, 1 or d]`: each row by its factor (factor
  `[..., t, 1]`) or elementwise. A row factor is applied as an einsum, whose gradient with
  respect to the factor is a matrix product (XLA on CPU runs the multiply-and-sum that
  autodiff writes for a broadcast ~10x slower)."""
  if factor.shape[-1] == x.shape[-1] != 1:
    return x * factor
  return jnp.einsum('...td,...t->...td', x, factor[..., 0])


def to_chunks(xs, chunk_size: int):
  """Each `[b, h, n, ...]` array of `xs` (None passes) zero-padded to a multiple of c and cut
  into `[n_chunks, b, h, c, ...]`; returns (chunks, c)."""
  n = next(x for x in xs if x is not None).shape[2]
  c = max(1, min(int(chunk_size), n))
  nc = -(-n // c)

  def cut(x):
    if x is None:
      return None
    x = jnp.pad(x, [(0, 0), (0, 0), (0, nc * c - n)] + [(0, 0)] * (x.ndim - 3))
    x = x.reshape(x.shape[:2] + (nc, c) + x.shape[3:])
    return jnp.moveaxis(x, 2, 0)

  return tuple(cut(x) for x in xs), c


def from_chunks(out, n: int):
  """`[n_chunks, b, h, c, dv]` -> `[b, n, h, dv]` (the first n tokens)."""
  nc, b, h, c, dv = out.shape
  out = jnp.moveaxis(out, 0, 2).reshape(b, h, nc * c, dv)[:, :, :n]
  return jnp.swapaxes(out, 1, 2)


def decay_matrix(cum, inclusive: bool = True):
  """exp(cum_t - cum_s) for s <= t (s < t if not inclusive), else 0: `[..., c, c]` from
  cumulative log-decays `[..., c]`; masked before exp, so every factor is <= 1."""
  c = cum.shape[-1]
  tri = jnp.tril(jnp.ones((c, c), bool), 0 if inclusive else -1)
  diff = cum[..., :, None] - cum[..., None, :]
  return jnp.where(tri, jnp.exp(jnp.where(tri, diff, 0.0)), 0.0)

"""The decay recurrence token by token: the definition, and the decoding step.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,      o_t = S_t^T q_t,

g_t the log-decay (one per head or one per key feature). `scan_tokens` runs any
recurrence's step over a sequence, packed rows too (the state starts again at each
document); the delta rule's (`efficient_attn.ops.delta`) too.
"""

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.gated import documents as docs_lib
from efficient_attn.ops.gated.common import F32
from efficient_attn.ops.gated.common import compute_dtype


def zero_state(batch: int, heads: int, dk: int, dv: int, dtype=F32):
  """The empty state S `[batch, heads, dk, dv]` (float32)."""
  return jnp.zeros((batch, heads, dk, dv), dtype)


def gated_step(s, q_t, k_t, v_t, g_t, beta_t=None):
  """One token: S = diag(exp(g_t)) S + k_t v_t^T, o_t = S^T q_t.

  s `[b, h, dk, dv]`; q_t, k_t `[b, h, dk]`; v_t `[b, h, dv]`; g_t `[b, h, 1 or dk]`
  (log-decay) or None (no decay). Returns (S, o_t `[b, h, dv]`), float32 (float64 where an
  input is).
  """
  del beta_t  # the decay family has no erase step
  dtype = compute_dtype(s, q_t, k_t, v_t, g_t)
  s, q_t, k_t, v_t = (x.astype(dtype) for x in (s, q_t, k_t, v_t))
  if g_t is not None:
    s = jnp.exp(g_t.astype(dtype))[..., None] * s
  s = s + k_t[..., :, None] * v_t[..., None, :]
  return s, jnp.einsum('bhk,bhkv->bhv', q_t, s)


def scan_tokens(step, q, k, v, g=None, beta=None, *, initial_state=None, segment_ids=None):
  """The recurrence `step(S, q_t, k_t, v_t, g_t, beta_t)` over every token (`lax.scan`).

  q, k `[b, n, h, dk]`, v `[b, n, h, dv]`, g `[b, n, h, 1 or dk]` or None, beta `[b, n, h]`
  or None; initial_state: S `[b, h, dk, dv]` (None: zeros); segment_ids `[b, n]` (None:
  one document a row): a padding token (0) writes nothing and reads 0, and the state
  starts from zero at each document after the row's first (which continues
  `initial_state`). Returns (out `[b, n, h, dv]`, final S: the last document's), float32
  (float64 where an input is).
  """
  b, n, h, dk = q.shape
  dtype = compute_dtype(q, k, v, g, beta, initial_state)
  packed = docs_lib.packed(segment_ids, b, n, 'the recurrence')
  if packed is not None:
    q, k, v, g, beta = docs_lib.zero_padding(packed.real, q, k, v, g, beta)
  s0 = zero_state(b, h, dk, v.shape[-1], dtype) if initial_state is None else initial_state
  xs = tuple(None if x is None else jnp.moveaxis(x.astype(dtype), 1, 0) for x in (q, k, v, g, beta))
  reset = None if packed is None else jnp.moveaxis(docs_lib.resets(packed.documents), 1, 0)

  def body(s, x):
    r, token = x
    if r is not None:
      s = docs_lib.where_rows(~r, s)
    return step(s, *token)

  s, out = lax.scan(body, s0.astype(dtype), (reset, xs))
  return jnp.moveaxis(out, 0, 1), s


def gated_scan(
  q, k, v, g=None, beta=None, *, initial_state=None, segment_ids=None, chunk_size=None
):
  """The decay recurrence token by token (the definition); see `scan_tokens`."""
  del chunk_size
  return scan_tokens(
    gated_step, q, k, v, g, beta, initial_state=initial_state, segment_ids=segment_ids
  )

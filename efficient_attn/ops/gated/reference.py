"""The decay recurrence token by token: the definition, and the decoding step.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,      o_t = S_t^T q_t,

g_t the log-decay (one per head or one per key feature). `scan_tokens` runs any
recurrence's step over a sequence; the delta rule's (`efficient_attn.ops.delta`) too.
"""

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.gated.common import F32


def zero_state(batch: int, heads: int, dk: int, dv: int):
  """The empty state S `[batch, heads, dk, dv]` (float32)."""
  return jnp.zeros((batch, heads, dk, dv), F32)


def gated_step(s, q_t, k_t, v_t, g_t, beta_t=None):
  """One token: S = diag(exp(g_t)) S + k_t v_t^T, o_t = S^T q_t.

  s `[b, h, dk, dv]`; q_t, k_t `[b, h, dk]`; v_t `[b, h, dv]`; g_t `[b, h, 1 or dk]`
  (log-decay). Returns (S, o_t `[b, h, dv]`), float32.
  """
  del beta_t  # the decay family has no erase step
  q_t, k_t, v_t, g_t = (x.astype(F32) for x in (q_t, k_t, v_t, g_t))
  s = jnp.exp(g_t)[..., None] * s + k_t[..., :, None] * v_t[..., None, :]
  return s, jnp.einsum('bhk,bhkv->bhv', q_t, s)


def scan_tokens(step, q, k, v, g, beta=None, state=None):
  """The recurrence `step(S, q_t, k_t, v_t, g_t, beta_t)` over every token (`lax.scan`).

  q, k `[b, n, h, dk]`, v `[b, n, h, dv]`, g `[b, n, h, 1 or dk]`, beta `[b, n, h]` or None;
  state: the initial S (None: zeros). Returns (out `[b, n, h, dv]`, final S), float32.
  """
  b, _, h, dk = q.shape
  s0 = zero_state(b, h, dk, v.shape[-1]) if state is None else state
  xs = tuple(None if x is None else jnp.moveaxis(x.astype(F32), 1, 0) for x in (q, k, v, g, beta))
  s, out = lax.scan(lambda s, x: step(s, *x), s0, xs)
  return jnp.moveaxis(out, 0, 1), s


def gated_scan(q, k, v, g, beta=None, state=None, chunk_size=None):
  """The decay recurrence token by token (the definition); see `scan_tokens`."""
  del chunk_size
  return scan_tokens(gated_step, q, k, v, g, beta, state)

"""The (gated) delta rule, by token and chunkwise in the WY form (UT transform).

DeltaNet (Schlag et al. 2021) writes to its state S `[dk, dv]` by correcting
what the key k_t retrieves towards v_t with a learning rate beta_t in (0, 1);
Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025) first decays the state by a_t:

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,     o_t = S_t^T q_t

(a_t = 1 for DeltaNet). Written as S_t = a_t S_{t-1} + k_t u_t^T, the
pseudo-values u_t = beta_t (v_t - a_t S_{t-1}^T k_t) of a chunk (Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length")
solve one unit lower-triangular system per chunk. With cumulative log-decays
b_t from the chunk start, G_ts = exp(b_t - b_s) and the chunk's start state S_0:

    (I + A) U = diag(beta) V - diag(beta exp(b)) K S_0,   A_ts = beta_t G_ts k_t.k_s (s < t)
    O = (Q * exp(b)) S_0 + ((Q K^T) * G, s <= t) U
    S_c = exp(b_c) S_0 + (K * exp(b_c - b))^T U

so U = T (beta V) - T (beta exp(b) K) S_0 with T = (I + A)^-1, the WY form: T (the
UT transform, `unit_lower_inverse`) is found for every chunk at once, by forward
substitution, before the scan over chunks. Every decay factor
is <= 1 (masked before exp). Keys should be L2-normalised (the mechanisms do),
which keeps I - beta k k^T a contraction.

Shapes as `efficient_attn.ops.gated_linear`: q, k `[b, n, h, dk]`, v `[b, n, h, dv]`,
beta `[b, n, h]`, log-decays `[b, n, h, 1]` or None; states `[b, h, dk, dv]`.
"""

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import collectives
from efficient_attn.ops import gated_linear
from efficient_attn.ops import kernels

F32 = jnp.float32


def delta_step(s, q_t, k_t, v_t, g_t, beta_t):
  """One token of the (gated) delta rule: (S, o_t `[b, h, dv]`), float32.

  s `[b, h, dk, dv]`; q_t, k_t `[b, h, dk]`; v_t `[b, h, dv]`; g_t `[b, h, 1]` or None
  (log-decay); beta_t `[b, h]`.
  """
  q_t, k_t, v_t, beta_t = (x.astype(F32) for x in (q_t, k_t, v_t, beta_t))
  if g_t is not None:
    s = jnp.exp(g_t.astype(F32))[..., None] * s
  u = beta_t[..., None] * (v_t - jnp.einsum('bhkv,bhk->bhv', s, k_t))
  s = s + k_t[..., :, None] * u[..., None, :]
  return s, jnp.einsum('bhk,bhkv->bhv', q_t, s)


def delta_scan(q, k, v, g, beta, state=None, chunk_size=None):
  """The delta rule token by token (the definition); see `gated_linear.scan_tokens`."""
  del chunk_size
  return gated_linear.scan_tokens(delta_step, q, k, v, g, beta, state)


@jax.custom_vjp
def unit_lower_inverse(a):
  """(I + A)^-1 for strictly lower-triangular A `[..., c, c]`, by forward substitution:
  row t of T = e_t - A_t T (rows s < t final), c steps each batched over every leading axis
  (XLA's batched triangular solve is many times slower on CPU). Its gradient is
  -T^T dT T^T, kept strictly lower."""
  return _unit_lower_inverse(a)


def _unit_lower_inverse(a):
  c = a.shape[-1]
  eye = jnp.broadcast_to(jnp.eye(c, dtype=a.dtype), a.shape)

  def row(t, inv):
    new = eye[..., t, :] - jnp.einsum('...s,...sj->...j', a[..., t, :], inv)
    return inv.at[..., t, :].set(new)

  return lax.fori_loop(1, c, row, eye)


def _inverse_fwd(a):
  inv = _unit_lower_inverse(a)
  return inv, inv


def _inverse_bwd(inv, d_inv):
  t = jnp.swapaxes(inv, -1, -2)
  return (jnp.tril(-(t @ d_inv @ t), -1),)


unit_lower_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def delta_chunked(q, k, v, g, beta, state=None, chunk_size: int = 64):
  """The (gated) delta rule chunkwise in the WY form; equals `delta_scan`.

  Time O(n c (dk + dv) + n dk dv + n c^2) per head: the c x c triangular solves of
  all chunks at once (they do not depend on the state), then a scan of matrix products
  over the chunks. Any length works (the last chunk is padded with
  beta = 0 tokens, which change nothing). Where q, k, v are all bfloat16 the matmuls take
  bfloat16 operands accumulated in float32 (`gated_linear.matmul_dtype`); the state, decays,
  beta and the triangular inverse are float32 whatever the inputs. Returns (out
  `[b, n, h, dv]`, final S).
  """
  b, n, h, dk = q.shape
  dv = v.shape[-1]
  gated = g is not None
  dtype = gated_linear.matmul_dtype(q, k, v)
  mm = lambda spec, x, y: gated_linear.mm(spec, x, y, dtype)
  xs = tuple(
    None if x is None else gated_linear.heads_first(x, t)
    for x, t in (
      (q, dtype),
      (k, dtype),
      (v, dtype),
      (g[..., 0] if gated else None, F32),
      (beta, F32),
    )
  )
  (qc, kc, vc, gc, bc), c = gated_linear.chunked(xs, chunk_size)
  s0 = gated_linear.init_gated_state(b, h, dk, dv) if state is None else state
  # The UT transform of every chunk at once (it does not depend on the carried state):
  # [T (beta V), T (beta exp(b) K)] with T = (I + A)^-1. Without a decay (DeltaNet) every
  # factor exp(.) is 1 and none is computed.
  causal = jnp.tril(jnp.ones((c, c), F32))
  cum = jnp.cumsum(gc, axis=-1) if gated else None  # [nc, b, h, c]
  decay = gated_linear.decay_within(cum) if gated else causal  # G_ts, s <= t
  rows = lambda x, f: gated_linear.rows(x, f[..., None])
  a = jnp.tril(rows(mm('...td,...sd->...ts', kc, kc) * decay, bc), -1)
  write = bc * jnp.exp(cum) if gated else bc
  rhs = jnp.concatenate([rows(vc.astype(F32), bc), rows(kc.astype(F32), write)], -1)
  solved = mm('...ts,...sd->...td', unit_lower_inverse(a), rhs)

  def body(s, x):
    qx, kx, cx, sx = x  # [b, h, c, ...]; cx [b, h, c]
    u = sx[..., :dv] - mm('bhtk,bhkv->bhtv', sx[..., dv:], s)
    qk = mm('bhtd,bhsd->bhts', qx, kx)
    if gated:
      last = cx[..., -1:]
      qk = qk * gated_linear.decay_within(cx)
      qx = rows(qx.astype(F32), jnp.exp(cx))
      kx = rows(kx.astype(F32), jnp.exp(last - cx))
    else:
      qk = qk * causal
    out = mm('bhtk,bhkv->bhtv', qx, s) + mm('bhts,bhsv->bhtv', qk, u)
    if gated:
      s = rows(s, jnp.broadcast_to(jnp.exp(last), s.shape[:-1]))
    return s + mm('bhtk,bhtv->bhkv', kx, u), out

  s, out = lax.scan(jax.checkpoint(body, prevent_cse=False), s0, (qc, kc, cum, solved))
  return gated_linear.unchunked(out, n), s


def transition_sharded(core, q, k, v, g, beta, *, chunk_size: int, axis: str):
  """The (gated) delta rule on this device's block of a sequence split over mesh axis
  `axis` (inside `jax.shard_map`), by composed state transitions.

  The block maps its incoming state S_in to M S_in + S, M = prod_t a_t (I - beta_t k_t
  k_t^T) `[dk, dk]` (the latest token on the left) and S its final state from zero. Each
  column of the state follows the recurrence on its own, so one pass of `core` on values
  [0 | v] from the state [I | 0] gives both (its final state is [M | S]) and, for every
  token, r_t = M_{1..t}^T q_t beside the zero-start output o_t. The blocks' (M, S) are
  composed over the devices before this one, (M1, S1) then (M2, S2) = (M2 M1, M2 S1 + S2)
  (`collectives.exclusive_scan`), and the output is o_t + S_in^T r_t: no second pass.

  Shapes as `delta_scan` (this block's); returns out `[b, m, h, dv]` (float32).
  """
  b, n, h, dk = k.shape
  dv = v.shape[-1]
  eye = jnp.eye(dk, dtype=F32)
  v_aug = jnp.concatenate([jnp.zeros((b, n, h, dk), F32), v.astype(F32)], -1)
  s0 = jnp.broadcast_to(jnp.concatenate([eye, jnp.zeros((dk, dv), F32)], -1), (b, h, dk, dk + dv))
  out, s = core(q, k, v_aug, g, beta, state=s0, chunk_size=chunk_size)

  def combine(earlier, later):
    (m1, s1), (m2, s2) = earlier, later
    return (jnp.einsum('bhij,bhjk->bhik', m2, m1), jnp.einsum('bhij,bhjv->bhiv', m2, s1) + s2)

  identity = (jnp.broadcast_to(eye, (b, h, dk, dk)), jnp.zeros((b, h, dk, dv), F32))
  _, s_in = collectives.exclusive_scan(combine, (s[..., :dk], s[..., dk:]), identity, axis)
  return out[..., dk:] + jnp.einsum('bnhk,bhkv->bnhv', out[..., :dk], s_in)


DELTA = gated_linear.Cores(
  delta_scan, delta_chunked, delta_step, gated_linear.init_gated_state, kernels.delta_chunked
)


def l2_normalize(x, eps: float = 1e-6):
  """x / sqrt(||x||^2 + eps) over the last axis (float32), as fla's l2norm."""
  x = x.astype(F32)
  return gated_linear.rows(x, lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps))

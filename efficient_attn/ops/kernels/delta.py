"""Pallas kernels of the delta rule, with a decay per head (Gated DeltaNet) and without
(DeltaNet), forward and backward in one `jax.custom_vjp`.

The recurrence is `efficient_attn.ops.delta`'s,
S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t, in its WY
chunk form (`delta.delta_chunked`). Per chunk, with
cumulative log-decays b `[C, 1]` (0 without a decay), G_ts = e^{b_t - b_s} (s <= t), the
start state S and T = (I + A)^-1, A_ts = beta_t G_ts k_t.k_s (s < t):

    W = T (beta e^b K),   U0 = T (beta V),   U = U0 - W S,
    O = (Q e^b) S + P U,  P = (Q K^T) * G,     S' = e^{b_C} S + (K e^{b_C - b})^T U.

T is found in the kernel by forward substitution (row t of T = e_t - A_t T, C steps on the
vector units, exact in float32 whatever the dots' precision), then W and U0 are dots.
Forward: one program per (batch, head) walks the chunks carrying S in float32 and stores
each chunk's start state. Backward: the chunks in reverse, carrying dS = dL/dS',
recomputing A, T, W, U0, U from the stored start state (Q~ = Q e^b, K~ = K e^{b_C - b}):

    dU = P^T dO + K~ dS',   dP = tril(dO U^T),   dQ~ = dO S^T,   dK~ = U dS'^T,
    dW = -dU S^T,   dKb = T^T dW,   dVb = T^T dU,   dA = -stril(dKb W^T + dVb U0^T)
    dS = e^{b_C} dS' + Q~^T dO - W^T dU,

(the last from T's gradient -T^T dT T^T with dT = dW Kb^T + dU Vb^T, as fla's WY
backward), then through A, P and the row factors to dQ, dK, dV, dbeta and db.

Dtypes as `scalar_decay`: q, k, v float32 or bfloat16 operands, float32 accumulation,
float32 state. Not verified on hardware (no GPU or TPU was available): the Triton lowering
of the nested `fori_loop`s (chunks; rows of T) and the `[C, 1]` blocks of b and beta.
"""

import functools
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels.common import F32
from efficient_attn.ops.kernels.common import dot

SDS = jax.ShapeDtypeStruct


class Config(NamedTuple):
  lay: common.Layout
  dtype: Any
  on: str
  gated: bool


def unit_lower_inverse(a):
  """(I + A)^-1 for strictly lower-triangular A `[C, C]` (float32), by forward substitution:
  row t of T = e_t - sum_s A_ts T_s, rows s < t already final (rows >= t still e_s)."""
  c = a.shape[0]
  at = a.T  # column t of at: row t of A
  rows = common.iota((c, c), 0)

  def step(t, inv):
    new = common.row(common.eye(c), t) - jnp.sum(common.col(at, t) * inv, axis=0, keepdims=True)
    return jnp.where(rows == t, new, inv)

  return lax.fori_loop(1, c, step, common.eye(c))


def _chunk(cfg: Config, q, k, v, b, beta):
  """The state-free part of a chunk: (G, A, T, W, U0, P, e^b, e^{b_C}, e^{b_C - b}, Kb, KK)."""
  c, dtype = cfg.lay.C, cfg.dtype
  incl, strict = common.lower(c), common.lower(c, strict=True)
  kf = k.astype(F32)
  if cfg.gated:
    bl = common.last(b)
    eb, el, ekd = jnp.exp(b), jnp.exp(bl), jnp.exp(bl - b)
    gm = common.decay_matrix(b, incl)
  else:
    eb = el = ekd = None
    gm = jnp.where(incl, 1.0, 0.0)
  kk = dot(k, k, dtype, tb=True)
  a = jnp.where(strict, beta * gm * kk, 0.0)
  t = unit_lower_inverse(a)
  kb = kf * beta if eb is None else kf * (beta * eb)
  w = dot(t, kb, dtype)
  u0 = dot(t, v.astype(F32) * beta, dtype)
  p = dot(q, k, dtype, tb=True) * gm
  return gm, a, t, w, u0, p, eb, el, ekd, kb, kk


def _scaled(x, f):
  return x if f is None else x * f


def _forward_kernel(*refs, cfg: Config, save: bool):
  """Refs: q, k, v, [b,] beta, s0 -> o, final state[, start states]."""
  lay, dtype = cfg.lay, cfg.dtype
  refs = list(refs)
  q_ref, k_ref, v_ref = refs[:3]
  b_ref = refs[3] if cfg.gated else None
  beta_ref, s0_ref, o_ref, st_ref = refs[3 + cfg.gated : 7 + cfg.gated]
  h_ref = refs[7 + cfg.gated] if save else None

  def body(i, s):
    rows = common.chunk_slice(i, lay.C)
    q, k, v, beta = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :], beta_ref[rows, :]
    b = b_ref[rows, :] if cfg.gated else None
    if save:
      h_ref[common.chunk_slice(i, lay.DK), :] = s
    _, _, _, w, u0, p, eb, el, ekd, _, _ = _chunk(cfg, q, k, v, b, beta)
    u = u0 - dot(w, s, dtype)
    o_ref[rows, :] = dot(_scaled(q.astype(F32), eb), s, dtype) + dot(p, u, dtype)
    return _scaled(s, el) + dot(_scaled(k.astype(F32), ekd), u, dtype, ta=True)

  st_ref[...] = lax.fori_loop(0, lay.nc, body, s0_ref[...].astype(F32))


def _backward_kernel(*refs, cfg: Config):
  """Refs: q, k, v, [b,] beta, start states, dO, dS_final -> dq, dk, dv, [db,] dbeta, ds0."""
  lay, dtype = cfg.lay, cfg.dtype
  C, gated = lay.C, cfg.gated
  refs = list(refs)
  q_ref, k_ref, v_ref = refs[:3]
  b_ref = refs.pop(3) if gated else None
  beta_ref, h_ref, do_ref, dst_ref, dq_ref, dk_ref, dv_ref = refs[3:10]
  db_ref = refs.pop(10) if gated else None
  dbeta_ref, ds0_ref = refs[10:12]
  strict, incl = common.lower(C, strict=True), common.lower(C)

  def body(j, ds):
    i = lay.nc - 1 - j
    rows = common.chunk_slice(i, C)
    q, k, v, beta = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :], beta_ref[rows, :]
    b = b_ref[rows, :] if gated else None
    do = do_ref[rows, :]
    s = h_ref[common.chunk_slice(i, lay.DK), :]
    qf, kf, vf = q.astype(F32), k.astype(F32), v.astype(F32)
    gm, _, t, w, u0, p, eb, el, ekd, kb, kk = _chunk(cfg, q, k, v, b, beta)
    u = u0 - dot(w, s, dtype)
    qe, kd = _scaled(qf, eb), _scaled(kf, ekd)

    du = dot(p, do, dtype, ta=True) + dot(kd, ds, dtype)  # [C, DV]
    dp = jnp.where(incl, dot(do, u, dtype, tb=True), 0.0)
    dqe = dot(do, s, dtype, tb=True)  # [C, DK]
    dkd = dot(u, ds, dtype, tb=True)
    dw = -dot(du, s, dtype, tb=True)
    dkb = dot(t, dw, dtype, ta=True)
    dvb = dot(t, du, dtype, ta=True)
    da = -jnp.where(strict, dot(dkb, w, dtype, tb=True) + dot(dvb, u0, dtype, tb=True), 0.0)
    # P = (Q K^T) * G and A = beta * G * (K K^T) at fixed G: their shares of dQ and dK.
    mp = dp * gm
    dqp, dkp = dot(mp, k, dtype), dot(mp, q, dtype, ta=True)
    mk = da * beta * gm
    dka_t, dka_s = dot(mk, k, dtype), dot(mk, k, dtype, ta=True)
    dq_ref[rows, :] = _scaled(dqe, eb) + dqp
    dk_ref[rows, :] = _scaled(dkd, ekd) + dkp + dka_t + dka_s + dkb * _scaled(beta, eb)
    dv_ref[rows, :] = dvb * beta
    dbeta_ref[rows, :] = (
      jnp.sum(dkb * _scaled(kf, eb), axis=1, keepdims=True)
      + jnp.sum(dvb * vf, axis=1, keepdims=True)
      + jnp.sum(da * gm * kk, axis=1, keepdims=True)
    )
    if gated:
      # G's share at fixed Q, K: sum_s dX_ts X_ts - sum_t dX_ts X_ts for X = P, A, written
      # with the dots above (no transposed vectors); then the row factors e^b, e^{b_C - b}.
      per_token = dqe * qe - dkd * kd + dkb * kb + qf * dqp - kf * dkp + kf * dka_t - kf * dka_s
      db = jnp.sum(per_token, axis=1, keepdims=True)  # [C, 1]
      rows_s = jnp.sum(s * ds, axis=1, keepdims=True)  # [DK, 1]
      dbl = jnp.sum(jnp.sum(dkd * kd, axis=1, keepdims=True), axis=0, keepdims=True) + el * jnp.sum(
        rows_s, axis=0, keepdims=True
      )
      db_ref[rows, :] = db + jnp.where(common.iota(db.shape, 0) == C - 1, dbl, 0.0)
    return _scaled(ds, el) + dot(qe, do, dtype, ta=True) - dot(w, du, dtype, ta=True)

  ds0_ref[...] = lax.fori_loop(0, lay.nc, body, dst_ref[...].astype(F32))


def _forward(cfg: Config, q, k, v, b, beta, s0, save: bool):
  lay = cfg.lay
  rows = lay.b * lay.h
  outs = [SDS((rows, lay.N, lay.DV), F32), SDS((rows, lay.DK, lay.DV), F32)]
  if save:
    outs.append(SDS((rows, lay.nc * lay.DK, lay.DV), F32))
  ins = [q, k, v] + ([b] if cfg.gated else []) + [beta, s0]
  return common.call(
    functools.partial(_forward_kernel, cfg=cfg, save=save),
    rows=rows,
    ins=ins,
    outs=outs,
    name=f'{_name(cfg)}_forward',
    on=cfg.on,
  )


def _name(cfg: Config) -> str:
  return 'gated_delta' if cfg.gated else 'delta'


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(cfg: Config, q, k, v, b, beta, s0):
  return tuple(_forward(cfg, q, k, v, b, beta, s0, save=False))


def _core_fwd(cfg: Config, q, k, v, b, beta, s0):
  out, st, hs = _forward(cfg, q, k, v, b, beta, s0, save=True)
  return (out, st), (q, k, v, b, beta, hs)


def _core_bwd(cfg: Config, res, cotangents):
  q, k, v, b, beta, hs = res
  do, dst = cotangents
  lay = cfg.lay
  rows = lay.b * lay.h
  outs = (
    [SDS(q.shape, F32), SDS(k.shape, F32), SDS(v.shape, F32)]
    + ([SDS(b.shape, F32)] if cfg.gated else [])
    + [SDS(beta.shape, F32), SDS((rows, lay.DK, lay.DV), F32)]
  )
  ins = [q, k, v] + ([b] if cfg.gated else []) + [beta, hs, do.astype(F32), dst.astype(F32)]
  grads = list(
    common.call(
      functools.partial(_backward_kernel, cfg=cfg),
      rows=rows,
      ins=ins,
      outs=outs,
      name=f'{_name(cfg)}_backward',
      on=cfg.on,
    )
  )
  dq, dk, dv = grads[:3]
  db = grads.pop(3) if cfg.gated else None
  dbeta, ds0 = grads[3:]
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), db, dbeta, ds0


_core.defvjp(_core_fwd, _core_bwd)


@common.per_device
def delta_chunked(q, k, v, g, beta, state=None, chunk_size: int = 64, *, on=None):
  """The (gated) delta rule by the Pallas kernels; equals `delta.delta_chunked` at the
  same chunk size.

  q, k `[b, n, h, dk]` (keys L2-normalised, as the mechanisms give them), v `[b, n, h, dv]`
  (float32 or bfloat16), g `[b, n, h, 1]` (log-decays <= 0) or None (DeltaNet), beta
  `[b, n, h]`, state `[b, h, dk, dv]` or None (zeros); on: the platform (default: JAX's
  backend; 'cpu' interprets the kernels). Returns (out `[b, n, h, dv]`, final state
  `[b, h, dk, dv]`), float32.
  """
  dtype = common.compute_dtype(q, k, v, 'delta')
  if g is not None and g.shape[-1] != 1:
    raise ValueError(
      f'delta: log-decays with a last dim of {g.shape[-1]}; the delta rule '
      f'takes one per head (1) or None'
    )
  if beta is None:
    raise ValueError('delta: beta is None; the delta rule needs its write strength beta')
  lay = common.layout(q, v, g, chunk_size)
  cfg = Config(lay, dtype, on or common.platform(), g is not None)
  qb, kb = (common.to_blocks(x, lay, lay.DK, dtype) for x in (q, k))
  vb = common.to_blocks(v, lay, lay.DV, dtype)
  b = common.chunk_cumsum(g, lay) if cfg.gated else None
  out, st = _core(
    cfg, qb, kb, vb, b, common.to_blocks(beta, lay, 1, F32), common.state_blocks(state, lay)
  )
  return common.from_blocks(out, lay, lay.dv), common.state_from_blocks(st, lay)

"""Pallas kernels of the decay recurrence with one decay per head (retention, Mamba-2), forward
and backward in one `jax.custom_vjp`; the per-feature decay (GLA) reuses them with its own
intra-chunk scores (`vector_decay`).

The recurrence is `efficient_attn.ops.gated`'s, S_t = diag(a_t) S_{t-1} + k_t v_t^T,
o_t = S_t^T q_t, computed chunk by chunk as `gated.gated_chunked` does. With chunk-local cumulative
log-decays b `[C, dg]` (b_C its last row), the chunk's start state S and the intra-chunk
scores A `[C, C]` (A_ts = sum_d q_td k_sd exp(b_td - b_sd), s <= t):

    O = A V + (Q * e^b) S,        S' = e^{b_C} S + (K * e^{b_C - b})^T V.

Forward: one program per (batch, head) walks the chunks in order (`lax.fori_loop`),
carrying S in float32, and stores each chunk's start state (the backward's residual,
`[n_chunks * DK, DV]`, as fla's chunk kernels keep h). Backward: one program per
(batch, head) walks the chunks in reverse carrying dS = dL/dS', reads the chunk's start
state back, recomputes A, and writes dQ, dK, dV and the gradient of the cumulative
log-decays db; dS = e^{b_C} dS' + (Q * e^b)^T dO carries on, and what is left at the
first chunk is the initial state's gradient. With Q~ = Q * e^b, K~ = K * e^{b_C - b}:

    dA = tril(dO V^T),   dV = A^T dO + K~ dS',   dQ~ = dO S^T,   dK~ = V dS'^T,
    dQ = dQ~ * e^b + dQ_A,   dK = dK~ * e^{b_C - b} + dK_A,
    db = dQ~ * Q~ - dK~ * K~ + Q * dQ_A - K * dK_A   (+ at the last row:
         sum_t dK~ * K~ + e^{b_C} sum_v S * dS'),

where dQ_A, dK_A are A's gradients at fixed b (here (dA * D) K and (dA * D)^T Q with
D_ts = e^{b_t - b_s}), and for a per-head decay db is summed over the features. The
wrapper turns db into the log-decays' gradient (the reverse cumulative sum, by autodiff of
`common.chunk_cumsum`).

Dtypes: q, k, v float32 or bfloat16; every dot takes its operands in that dtype and
accumulates in float32 (`preferred_element_type`), as fla's kernels do; states, decays
and the outputs are float32.

Not verified on hardware (no GPU or TPU was available): the Triton lowering of the
`fori_loop` over chunks with dynamic `pl.ds` slices, the `[C, 1]` decay blocks and the
`[1, DK] -> [DK, 1]` transposes; on TPU, whole-sequence blocks in VMEM limit the length.
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels.common import F32
from efficient_attn.ops.kernels.common import dot

SDS = jax.ShapeDtypeStruct


def scores(q, k, b, dtype):
  """A_ts = (q_t . k_s) exp(b_t - b_s) for s <= t, else 0: `[C, C]` (b `[C, 1]`)."""
  return dot(q, k, dtype, tb=True) * common.decay_matrix(b, common.lower(q.shape[0]))


def scores_grad(da, q, k, b, dtype):
  """(dQ, dK) of `scores` at fixed b, from dA `[C, C]`."""
  m = da * common.decay_matrix(b, common.lower(q.shape[0]))
  return dot(m, k, dtype), dot(m, q, dtype, ta=True)


class Config(NamedTuple):
  """What one compiled kernel pair depends on (static)."""

  lay: common.Layout
  dtype: Any
  on: str
  scores: Callable[..., Any]
  scores_grad: Callable[..., Any]
  name: str


def _state_decay_grad(s, ds, dg: int):
  """sum_v S * dS per state row `[1, DK]` (dg > 1), or over the whole state `[1, 1]`."""
  rows = jnp.sum(s * ds, axis=1, keepdims=True)  # [DK, 1]
  return jnp.sum(rows, axis=0, keepdims=True) if dg == 1 else rows.T


def _forward_kernel(q_ref, k_ref, v_ref, b_ref, s0_ref, o_ref, st_ref, *h_ref, cfg: Config):
  lay, dtype = cfg.lay, cfg.dtype

  def body(i, s):
    rows = common.chunk_slice(i, lay.C)
    q, k, v, b = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :], b_ref[rows, :]
    if h_ref:
      h_ref[0][common.chunk_slice(i, lay.DK), :] = s
    bl = common.last(b)  # [1, dg]
    a = cfg.scores(q, k, b, dtype)
    qe = q.astype(F32) * jnp.exp(b)
    o_ref[rows, :] = dot(a, v, dtype) + dot(qe, s, dtype)
    kd = k.astype(F32) * jnp.exp(bl - b)
    return jnp.exp(bl).T * s + dot(kd, v, dtype, ta=True)

  st_ref[...] = lax.fori_loop(0, lay.nc, body, s0_ref[...].astype(F32))


def _backward_kernel(
  q_ref,
  k_ref,
  v_ref,
  b_ref,
  h_ref,
  do_ref,
  dst_ref,
  dq_ref,
  dk_ref,
  dv_ref,
  db_ref,
  ds0_ref,
  *,
  cfg: Config,
):
  lay, dtype = cfg.lay, cfg.dtype
  C, dg = lay.C, lay.dg

  def body(j, ds):
    i = lay.nc - 1 - j
    rows = common.chunk_slice(i, C)
    q, k, v, b = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :], b_ref[rows, :]
    do = do_ref[rows, :]
    s = h_ref[common.chunk_slice(i, lay.DK), :]
    qf, kf = q.astype(F32), k.astype(F32)
    bl = common.last(b)
    eb, el, ekd = jnp.exp(b), jnp.exp(bl), jnp.exp(bl - b)
    a = cfg.scores(q, k, b, dtype)
    qe, kd = qf * eb, kf * ekd
    da = jnp.where(common.lower(C), dot(do, v, dtype, tb=True), 0.0)
    dv_ref[rows, :] = dot(a, do, dtype, ta=True) + dot(kd, ds, dtype)
    dqe = dot(do, s, dtype, tb=True)  # [C, DK]
    dkd = dot(v, ds, dtype, tb=True)
    dqa, dka = cfg.scores_grad(da, q, k, b, dtype)
    dq_ref[rows, :] = dqe * eb + dqa
    dk_ref[rows, :] = dkd * ekd + dka
    db = common.feature_sum(dqe * qe - dkd * kd + qf * dqa - kf * dka, dg)
    dbl = common.feature_sum(jnp.sum(dkd * kd, axis=0, keepdims=True), dg) + el * _state_decay_grad(
      s, ds, dg
    )
    db_ref[rows, :] = db + jnp.where(common.iota(db.shape, 0) == C - 1, dbl, 0.0)
    return el.T * ds + dot(qe, do, dtype, ta=True)

  ds0_ref[...] = lax.fori_loop(0, lay.nc, body, dst_ref[...].astype(F32))


def _forward(cfg: Config, q, k, v, b, s0, save: bool):
  lay = cfg.lay
  rows = lay.b * lay.h
  outs = [SDS((rows, lay.N, lay.DV), F32), SDS((rows, lay.DK, lay.DV), F32)]
  if save:
    outs.append(SDS((rows, lay.nc * lay.DK, lay.DV), F32))
  return common.call(
    functools.partial(_forward_kernel, cfg=cfg),
    rows=rows,
    ins=[q, k, v, b, s0],
    outs=outs,
    name=f'{cfg.name}_forward',
    on=cfg.on,
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(cfg: Config, q, k, v, b, s0):
  return tuple(_forward(cfg, q, k, v, b, s0, save=False))


def _core_fwd(cfg: Config, q, k, v, b, s0):
  out, st, hs = _forward(cfg, q, k, v, b, s0, save=True)
  return (out, st), (q, k, v, b, hs)


def _core_bwd(cfg: Config, res, cotangents):
  q, k, v, b, hs = res
  do, dst = cotangents
  lay = cfg.lay
  rows = lay.b * lay.h
  outs = [
    SDS(q.shape, F32),
    SDS(k.shape, F32),
    SDS(v.shape, F32),
    SDS(b.shape, F32),
    SDS((rows, lay.DK, lay.DV), F32),
  ]
  dq, dk, dv, db, ds0 = common.call(
    functools.partial(_backward_kernel, cfg=cfg),
    rows=rows,
    ins=[q, k, v, b, hs, do.astype(F32), dst.astype(F32)],
    outs=outs,
    name=f'{cfg.name}_backward',
    on=cfg.on,
  )
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), db, ds0


_core.defvjp(_core_fwd, _core_bwd)


def decay_kernel(
  q,
  k,
  v,
  g,
  state,
  chunk_size: int,
  *,
  per_feature: bool,
  scores_fn,
  scores_grad_fn,
  name: str,
  on=None,
):
  """The decay recurrence by the kernels; see `scalar_decay_chunked`."""
  dtype = common.compute_dtype(q, k, v, name)
  want = q.shape[-1] if per_feature else 1
  if g is None or g.shape[-1] != want:
    got = None if g is None else g.shape[-1]
    raise ValueError(f'{name}: log-decays with a last dim of {got}; this kernel takes {want}')
  lay = common.layout(q, v, g, chunk_size)
  cfg = Config(lay, dtype, on or common.platform(), scores_fn, scores_grad_fn, name)
  qb, kb = (common.to_blocks(x, lay, lay.DK, dtype) for x in (q, k))
  vb = common.to_blocks(v, lay, lay.DV, dtype)
  out, st = _core(cfg, qb, kb, vb, common.chunk_cumsum(g, lay), common.state_blocks(state, lay))
  return common.from_blocks(out, lay, lay.dv), common.state_from_blocks(st, lay)


@common.per_device
def scalar_decay_chunked(q, k, v, g, beta=None, state=None, chunk_size: int = 64, *, on=None):
  """The decay recurrence with one log-decay per head, by the Pallas kernels; equals
  `gated.gated_chunked` at the same chunk size.

  q, k `[b, n, h, dk]`, v `[b, n, h, dv]` (float32 or bfloat16), g `[b, n, h, 1]` (log-decays
  <= 0), beta ignored (the decay family has no erase step), state `[b, h, dk, dv]` or None
  (zeros). on: the platform (default: JAX's backend; 'cpu' interprets the kernels).
  Returns (out `[b, n, h, dv]`, final state `[b, h, dk, dv]`), float32.
  """
  del beta
  return decay_kernel(
    q,
    k,
    v,
    g,
    state,
    chunk_size,
    per_feature=False,
    scores_fn=scores,
    scores_grad_fn=scores_grad,
    name='scalar_decay',
    on=on,
  )

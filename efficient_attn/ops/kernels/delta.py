"""Pallas kernels of the delta rule, with a decay per head (Gated DeltaNet), per key
feature (Kimi Delta Attention) or none (DeltaNet), forward and backward in one
`jax.custom_vjp`.

The recurrence (fla's `naive_recurrent_kda` for a per-feature decay):

    S_t = (I - beta_t k_t k_t^T) diag(a_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t,

a_t one number (Gated DeltaNet; then it is `efficient_attn.ops.delta`'s), one per key
feature (KDA), or 1 (DeltaNet). In its WY chunk form, with cumulative log-decays b
`[C, dg]`, the start state S, the document masks of `common.masks` and the scores of
`scores.scores` (R of k against k under strict, P of q against k under incl):

    A = beta R,   T = (I + A)^-1,   Kb = K beta e^b first,
    W = T Kb,   U0 = T (beta V),   U = U0 - W S,
    O = (Q e^b first) S + P U,   S' = e^{b_C} keep S + (K e^{b_C - b} last)^T U.

T is found in the kernel by forward substitution (row t of T = e_t - A_t T, C steps on the
vector units, exact in float32 whatever the dots' precision); with documents A is block
diagonal, one system per document, and a later document's rows of W are 0 (it does not
read the carried state). Backward, the chunks in reverse carrying dS = dL/dS', with
Q~ = Q e^b first, K~ = K e^{b_C - b} last:

    dU = P^T dO + K~ dS',   dP = dO U^T,   dQ~ = dO S^T,   dK~ = U dS'^T,
    dW = -dU S^T,   dKb = T^T dW,   dVb = T^T dU,   dA = -(dKb W^T + dVb U0^T) (strict),
    dS = e^{b_C} keep dS' + Q~^T dO - W^T dU

(the last from T's gradient -T^T dT T^T with dT = dW Kb^T + dU Vb^T, as fla's WY
backward); then through P and R (`scores.scores_grad`) and the row factors to dQ, dK,
dV, dbeta and db.

Dtypes as `scalar_decay`: q, k, v float32 or bfloat16 operands, float32 accumulation,
float32 state.
"""

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels import recurrence
from efficient_attn.ops.kernels import scores
from efficient_attn.ops.kernels.common import F32
from efficient_attn.ops.kernels.common import dot
from efficient_attn.ops.kernels.common import scaled


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


def _wy(cfg, x, m, f):
  """The state-free part of a chunk: (R, T, W, U0, P, Kb)."""
  q, k, v, b, beta = x['q'], x['k'], x['v'], x.get('b'), x['beta']
  r = scores.scores(k, k, b, m.strict, cfg)
  t = unit_lower_inverse(beta * r)
  kb = scaled(k.astype(F32), beta, f.eb, m.first)
  w = dot(t, kb, cfg)
  u0 = dot(t, v.astype(F32) * beta, cfg)
  p = scores.scores(q, k, b, m.incl, cfg)
  return r, t, w, u0, p, kb


def forward(cfg, x, s):
  """One chunk: (o `[C, BV]`, S' `[DK, BV]`) from the start state s (module docstring)."""
  m = common.masks(x['d'])
  f = common.factors(x.get('b'))
  _, _, w, u0, p, _ = _wy(cfg, x, m, f)
  u = u0 - dot(w, s, cfg)
  qe = scaled(x['q'].astype(F32), f.eb, m.first)
  kd = scaled(x['k'].astype(F32), f.ekd, m.last)
  keep = scaled(m.keep, None if f.el is None else f.el.T)  # [1 or DK, 1]
  return dot(qe, s, cfg) + dot(p, u, cfg), keep * s + dot(kd, u, cfg, ta=True)


def backward(cfg, x, s, ds, do):
  """One chunk backward: ({q, k, v, beta[, b]: gradients}, dS before the chunk)."""
  q, k, v, b, beta = x['q'], x['k'], x['v'], x.get('b'), x['beta']
  m = common.masks(x['d'])
  f = common.factors(b)
  qf, kf, vf = q.astype(F32), k.astype(F32), v.astype(F32)
  r, t, w, u0, p, kb = _wy(cfg, x, m, f)
  u = u0 - dot(w, s, cfg)
  qe = scaled(qf, f.eb, m.first)
  kd = scaled(kf, f.ekd, m.last)

  du = dot(p, do, cfg, ta=True) + dot(kd, ds, cfg)  # [C, BV]
  dqe = dot(do, s, cfg, tb=True)  # [C, DK]
  dkd = dot(u, ds, cfg, tb=True)
  dkb = dot(t, -dot(du, s, cfg, tb=True), cfg, ta=True)
  dvb = dot(t, du, cfg, ta=True)
  da = -(dot(dkb, w, cfg, tb=True) + dot(dvb, u0, cfg, tb=True))  # masked by scores_grad
  dqp, dkp = scores.scores_grad(dot(do, u, cfg, tb=True), q, k, b, m.incl, cfg)
  dkr, dkr_s = scores.scores_grad(da * beta, k, k, b, m.strict, cfg)
  grads = {
    'q': scaled(dqe, f.eb, m.first) + dqp,
    'k': scaled(dkd, f.ekd, m.last) + dkp + dkr + dkr_s + dkb * scaled(beta, f.eb, m.first),
    'v': dvb * beta,
    'beta': (
      jnp.sum(dkb * scaled(kf, f.eb, m.first), axis=1, keepdims=True)
      + jnp.sum(dvb * vf, axis=1, keepdims=True)
      + jnp.sum(da * r, axis=1, keepdims=True)
    ),
  }
  el_keep = scaled(m.keep, f.el)  # [1, 1 or DK]
  if b is not None:
    # G's share at fixed q, k (X dX - Y dY of each score matrix), then the row factors
    # e^b (of Q~ and Kb) and e^{b_C - b} (of K~).
    dg = cfg.lay.dg
    per_token = dqe * qe - dkd * kd + dkb * kb + qf * dqp - kf * dkp + kf * dkr - kf * dkr_s
    end = common.feature_sum(jnp.sum(dkd * kd, axis=0, keepdims=True), dg)
    end = end + el_keep * common.state_decay_grad(s, ds, dg)
    grads['b'] = common.at_last_row(common.feature_sum(per_token, dg), end)
  ds_prev = el_keep.T * ds + dot(qe, do, cfg, ta=True) - dot(w, du, cfg, ta=True)
  return grads, ds_prev


KIND = recurrence.Kind(forward, backward)


delta_chunked = recurrence.entry(
  KIND,
  'delta',
  (0, 1, 'dk'),
  """The delta rule by the Pallas kernels; equals `delta.delta_chunked` for a decay per head
or none, and the token recurrence of the module docstring for a decay per feature.

q, k `[b, n, h, dk]` (keys L2-normalised, as the mechanisms give them), v `[b, n, h, dv]`
(float32 or bfloat16); log_decay `[b, n, h, 1]` (Gated DeltaNet), `[b, n, h, dk]` (KDA)
or None (DeltaNet), <= 0; beta `[b, n, h]`; the other arguments and the result as
`scalar_decay.scalar_decay_chunked`.
""",
)

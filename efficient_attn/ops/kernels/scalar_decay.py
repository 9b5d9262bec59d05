"""Pallas kernels of the decay recurrence with one decay per head (retention, Mamba-2) or
none (linear attention), forward and backward in one `jax.custom_vjp`; the per-feature
decay (GLA, `vector_decay`) runs the same chunk step with its own scores.

The recurrence is `efficient_attn.ops.gated`'s, S_t = diag(a_t) S_{t-1} + k_t v_t^T,
o_t = S_t^T q_t, computed chunk by chunk. With chunk-local cumulative log-decays b
`[C, dg]` (b_C its last row), the chunk's start state S, the document masks of
`common.masks` (first, last `[C, 1]`, keep `[1, 1]`, incl `[C, C]`) and the intra-chunk
scores A (`scores.scores` under incl):

    Q~ = Q e^b first,   K~ = K e^{b_C - b} last,
    O = A V + Q~ S,     S' = e^{b_C} keep S + K~^T V.

Backward, the chunks in reverse carrying dS = dL/dS' (what is left at the first chunk is
the initial state's gradient):

    dA = dO V^T (masked),   dV = A^T dO + K~ dS',   dQ~ = dO S^T,   dK~ = V dS'^T,
    dQ = dQ~ e^b first + dQ_A,   dK = dK~ e^{b_C - b} last + dK_A,
    db = dQ~ Q~ - dK~ K~ + Q dQ_A - K dK_A   (+ at the last row:
         sum_t dK~ K~ + e^{b_C} keep sum_v S dS'),
    dS = e^{b_C} keep dS' + Q~^T dO,

where dQ_A, dK_A are A's gradients at fixed b (`scores.scores_grad`), and for a decay per
head db is summed over the features. The wrapper turns db into the log-decays' gradient
(the reverse cumulative sum, by autodiff of `common.chunk_cumsum`).

Dtypes: q, k, v float32 or bfloat16; every dot takes its operands in that dtype and
accumulates in float32, as fla's kernels do; states, decays and outputs are float32.
"""

import jax.numpy as jnp

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels import recurrence
from efficient_attn.ops.kernels import scores
from efficient_attn.ops.kernels.common import F32
from efficient_attn.ops.kernels.common import dot
from efficient_attn.ops.kernels.common import scaled


def forward(cfg, x, s):
  """One chunk: (o `[C, BV]`, S' `[DK, BV]`) from the start state s (module docstring)."""
  q, k, v, b = x['q'], x['k'], x['v'], x.get('b')
  m = common.masks(x['d'])
  f = common.factors(b)
  a = scores.scores(q, k, b, m.incl, cfg)
  qe = scaled(q.astype(F32), f.eb, m.first)
  kd = scaled(k.astype(F32), f.ekd, m.last)
  o = dot(a, v, cfg) + dot(qe, s, cfg)
  keep = scaled(m.keep, None if f.el is None else f.el.T)  # [1 or DK, 1]
  return o, keep * s + dot(kd, v, cfg, ta=True)


def backward(cfg, x, s, ds, do):
  """One chunk backward: ({q, k, v[, b]: gradients}, dS before the chunk)."""
  q, k, v, b = x['q'], x['k'], x['v'], x.get('b')
  m = common.masks(x['d'])
  f = common.factors(b)
  qf, kf = q.astype(F32), k.astype(F32)
  a = scores.scores(q, k, b, m.incl, cfg)
  qe = scaled(qf, f.eb, m.first)
  kd = scaled(kf, f.ekd, m.last)
  dqa, dka = scores.scores_grad(dot(do, v, cfg, tb=True), q, k, b, m.incl, cfg)
  dqe = dot(do, s, cfg, tb=True)  # [C, DK]
  dkd = dot(v, ds, cfg, tb=True)
  grads = {
    'q': scaled(dqe, f.eb, m.first) + dqa,
    'k': scaled(dkd, f.ekd, m.last) + dka,
    'v': dot(a, do, cfg, ta=True) + dot(kd, ds, cfg),
  }
  el_keep = scaled(m.keep, f.el)  # [1, 1 or DK]
  if b is not None:
    dg = cfg.lay.dg
    db = common.feature_sum(dqe * qe - dkd * kd + qf * dqa - kf * dka, dg)
    end = common.feature_sum(jnp.sum(dkd * kd, axis=0, keepdims=True), dg)
    end = end + el_keep * common.state_decay_grad(s, ds, dg)
    grads['b'] = common.at_last_row(db, end)
  return grads, el_keep.T * ds + dot(qe, do, cfg, ta=True)


KIND = recurrence.Kind(forward, backward)


scalar_decay_chunked = recurrence.entry(
  KIND,
  'scalar_decay',
  (0, 1),
  """The decay recurrence with one log-decay per head (or none), by the Pallas kernels;
equals `gated.gated_chunked` (docs/design.md, "One interface for the recurrences").

q, k `[b, n, h, dk]`, v `[b, n, h, dv]` (float32 or bfloat16); log_decay `[b, n, h, 1]`
(<= 0) or None (no decay); beta: None (the decay family has no erase step);
initial_state `[b, h, dk, dv]` or None (zeros), the row's first document's;
segment_ids `[b, n]` int or None (0: padding; a document is a run of equal ids);
precision: 'tf32' (fla's default; errors ~2e-3 of the scale) or 'highest' (~1e-6), the
float32 dots on a GPU (`recurrence.GPU_PRECISION`; a TPU and the interpreter compute
them in float32); backend: None (the platform's, chosen when lowering),
'mosaic' or 'triton' (that driver; interpreted on a CPU); value_tile: the GPU's value
tile (None: `gpu.gpu_blocks`). Returns (out `[b, n, h, dv]`, final state
`[b, h, dk, dv]`: the last document's), float32.
""",
)

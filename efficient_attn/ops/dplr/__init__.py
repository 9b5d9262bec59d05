"""The diagonal-plus-low-rank (DPLR) recurrence, flash-linear-attention's generalised delta
rule (`fla.ops.generalized_delta_rule.dplr`), by token and chunkwise in the WY form.

    S_t = (diag(exp(g_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T,      o_t = S_t^T q_t,

with the state S `[dk, dv]`, a log-decay g_t <= 0 per key feature (or per head) and a
rank-one correction of the transition by the pair (a_t, b_t). DeltaNet's delta rule is
a = -k, b = beta k with the write key beta k (Gated DeltaNet: b = beta exp(g) k); RWKV-7
(Peng et al. 2025) removes along its removal key kappa at its in-context rate alpha:
a = -kappa, b = alpha * kappa (`efficient_attn.mechanisms.rwkv7`).
The forms, one module each:

  * `reference`: the recurrence token by token (`dplr_scan`, the definition) and one token
    of decoding (`dplr_step`);
  * `chunk`: chunkwise in the WY form (`dplr_chunked`), every chunk an affine map of its
    start state found at once, then a scan over the chunks.

`DPLR` holds the forms as a `Cores` tuple (`efficient_attn.ops.gated.common`, no Pallas
kernel yet). Every form takes the one signature of docs/design.md with the low-rank pairs
in beta's place: `form(q, k, v, g, ab, *, initial_state=None, segment_ids=None,
chunk_size=64)`, ab `[batch, length, heads, 2, dk]` (a_t then b_t), and computes in
float32 (float64 where an input is). A padded token (segment 0) has g = a = b = 0: its
transition is I. One device's block of a split sequence is `delta.transition_sharded`
(composed transitions; it needs only that each column of S follows the recurrence alone).

Shapes: q, k `[b, n, h, dk]`, v `[b, n, h, dv]`, g `[b, n, h, 1 or dk]` or None; states
`[b, h, dk, dv]`.
"""

from efficient_attn.ops.dplr.chunk import dplr_chunked
from efficient_attn.ops.dplr.chunk import pair_scores
from efficient_attn.ops.dplr.reference import dplr_scan
from efficient_attn.ops.dplr.reference import dplr_step
from efficient_attn.ops.gated.common import Cores
from efficient_attn.ops.gated.reference import zero_state

DPLR = Cores(dplr_scan, dplr_chunked, dplr_step, zero_state)

__all__ = ['DPLR', 'dplr_chunked', 'dplr_scan', 'dplr_step', 'pair_scores']

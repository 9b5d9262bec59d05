"""The decay recurrence of gated linear attention, in its three forms.

The decay family (RetNet's retention, Sun et al. 2023; GLA, Yang et al. 2024;
Mamba-2's state space duality, Dao & Gu 2024) is one recurrence per head,

    S_t = diag(a_t) S_{t-1} + k_t v_t^T,      o_t = S_t^T q_t,

with a state S `[dk, dv]` and a decay a_t in (0, 1] that is one number per head
(retention, Mamba-2) or one per key feature (GLA). Decays are given as log-decays
g_t = log a_t <= 0, in float32. The forms, one module each:

  * `reference`: the recurrence itself, one token at a time (`gated_scan`, the
    definition), and one token of decoding (`gated_step`, O(dk dv) whatever the
    position);
  * `chunk`: chunkwise parallel (`gated_chunked`, Yang et al. 2024, section 3);
  * `sharded`: one device's block of a sequence split over a mesh axis
    (`decayed_sharded`);
  * `common`: what the forms (and the delta rule's, `efficient_attn.ops.delta`) share;
  * `documents`: packed rows (`segment_ids`) in every form, masks not decays of -inf.

Every form takes the one signature of docs/design.md, `form(q, k, v, log_decay, beta, *,
initial_state=None, segment_ids=None, chunk_size=64) -> (out, final state)`, and computes
in float32 (float64 where an input is float64).

`DECAY` holds the forms as a `Cores` tuple, with the Pallas kernels of the chunk form
(`efficient_attn.ops.kernels`). The mechanisms' declaration around them is
`efficient_attn.mechanisms.gated_family`.

Shapes: q, k `[batch, length, heads, dk]`, v `[batch, length, heads, dv]`,
log-decays `[batch, length, heads, 1 or dk]`; outputs `[batch, length, heads,
dv]`; states `[batch, heads, dk, dv]`.
"""

from efficient_attn.ops import kernels
from efficient_attn.ops.gated import documents
from efficient_attn.ops.gated.chunk import SUB_CHUNK
from efficient_attn.ops.gated.chunk import gated_chunked
from efficient_attn.ops.gated.chunk import per_feature_scores
from efficient_attn.ops.gated.common import Cores
from efficient_attn.ops.gated.common import pallas_form
from efficient_attn.ops.gated.reference import gated_scan
from efficient_attn.ops.gated.reference import gated_step
from efficient_attn.ops.gated.reference import scan_tokens
from efficient_attn.ops.gated.reference import zero_state
from efficient_attn.ops.gated.sharded import decayed_sharded

DECAY = Cores(gated_scan, gated_chunked, gated_step, zero_state, pallas_form(kernels.decay_chunked))

__all__ = [
  'DECAY',
  'SUB_CHUNK',
  'Cores',
  'decayed_sharded',
  'documents',
  'gated_chunked',
  'gated_scan',
  'gated_step',
  'per_feature_scores',
  'scan_tokens',
  'zero_state',
]

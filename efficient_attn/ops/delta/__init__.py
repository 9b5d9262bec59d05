"""The (gated) delta rule, by token and chunkwise in the WY form (UT transform).

DeltaNet (Schlag et al. 2021) writes to its state S `[dk, dv]` by correcting
what the key k_t retrieves towards v_t with a learning rate beta_t in (0, 1);
Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025) first decays the state by a_t, one number a
head, and Kimi Delta Attention (Kimi Team 2025) by a_t, one per key feature:

    S_t = (I - beta_t k_t k_t^T) diag(a_t) S_{t-1} + beta_t k_t v_t^T,     o_t = S_t^T q_t

(a_t = 1 for DeltaNet). The forms, one module each:

  * `reference`: the recurrence token by token (`delta_scan`, the definition) and one
    token of decoding (`delta_step`);
  * `chunk`: chunkwise in the WY form (`delta_chunked`), its unit lower-triangular
    inverse (`unit_lower_inverse`) found for every chunk at once;
  * `sharded`: one device's block of a sequence split over a mesh axis, by composed
    state transitions (`transition_sharded`).

`DELTA` holds the forms as a `Cores` tuple (`efficient_attn.ops.gated.common`), with the
Pallas kernels of the chunk form (`efficient_attn.ops.kernels`). Keys should be
L2-normalised (the mechanisms do, `efficient_attn.ops.norm.l2_normalize`), which keeps
I - beta k k^T a contraction.

Shapes as `efficient_attn.ops.gated`: q, k `[b, n, h, dk]`, v `[b, n, h, dv]`,
beta `[b, n, h]`, log-decays `[b, n, h, 1]` (a head), `[b, n, h, dk]` (a key feature) or
None; states `[b, h, dk, dv]`.
"""

from efficient_attn.ops import kernels
from efficient_attn.ops.delta.chunk import delta_chunked
from efficient_attn.ops.delta.chunk import unit_lower_inverse
from efficient_attn.ops.delta.reference import delta_scan
from efficient_attn.ops.delta.reference import delta_step
from efficient_attn.ops.delta.sharded import transition_sharded
from efficient_attn.ops.gated.common import Cores
from efficient_attn.ops.gated.common import pallas_form
from efficient_attn.ops.gated.reference import zero_state

DELTA = Cores(delta_scan, delta_chunked, delta_step, zero_state, pallas_form(kernels.delta_chunked))

__all__ = [
  'DELTA',
  'delta_chunked',
  'delta_scan',
  'delta_step',
  'transition_sharded',
  'unit_lower_inverse',
]

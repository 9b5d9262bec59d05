"""Pallas kernels of the decay recurrence with one decay per key feature (GLA), forward and
backward in one `jax.custom_vjp`.

The chunk step, the carried state and the backward are `scalar_decay`'s (see there for the
equations), with e^b, e^{b_C - b} per feature and the state's rows decayed by e^{b_C}
`[DK]`; what differs is the intra-chunk scores A_ts = sum_d q_td k_sd exp(b_td - b_sd),
formed key by key with every factor <= 1 (`scores`, decay 'feature').
"""

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels import recurrence
from efficient_attn.ops.kernels import scalar_decay


@common.per_device
def vector_decay_chunked(
  q,
  k,
  v,
  log_decay,
  beta=None,
  *,
  initial_state=None,
  segment_ids=None,
  chunk_size: int = 64,
  precision: str = 'tf32',
  backend=None,
  value_tile=None,
):
  """The decay recurrence with one log-decay per key feature, by the Pallas kernels; equals
  `gated.gated_chunked`.

  log_decay `[b, n, h, dk]` (<= 0); the other arguments and the result as
  `scalar_decay.scalar_decay_chunked`.
  """
  return recurrence.run(
    scalar_decay.KIND,
    'vector_decay',
    q,
    k,
    v,
    log_decay,
    beta,
    decays=('dk',),
    initial_state=initial_state,
    segment_ids=segment_ids,
    chunk_size=chunk_size,
    precision=precision,
    backend=backend,
    value_tile=value_tile,
  )

"""Pallas kernels of the decay recurrence with one decay per key feature (GLA), forward and
backward in one `jax.custom_vjp`.

The chunk step, the carried state and the backward are `scalar_decay`'s (see there for the
equations), with e^b, e^{b_C - b} per feature and the state's rows decayed by e^{b_C}
`[DK]`; what differs is the intra-chunk scores A_ts = sum_d q_td k_sd exp(b_td - b_sd),
formed key by key with every factor <= 1 (`scores`, decay 'feature').
"""

from efficient_attn.ops.kernels import recurrence
from efficient_attn.ops.kernels import scalar_decay

vector_decay_chunked = recurrence.entry(
  scalar_decay.KIND,
  'vector_decay',
  ('dk',),
  """The decay recurrence with one log-decay per key feature, by the Pallas kernels; equals
`gated.gated_chunked`.

log_decay `[b, n, h, dk]` (<= 0); the other arguments and the result as
`scalar_decay.scalar_decay_chunked`.
""",
)

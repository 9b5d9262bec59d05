"""Pallas kernels of the gated recurrences' chunk forms, and the rule that picks one.

The five recurrences (retention, GLA, Mamba-2, DeltaNet, Gated DeltaNet) take
`implementation='auto' | 'xla' | 'pallas'` (`mechanisms.gated_family.common_options`),
resolved once per call by `choose`, as `efficient_attn.ops.fused_softmax` resolves softmax's:

  'xla'    the chunk form in XLA (`gated.gated_chunked`, `delta.delta_chunked`),
           or with form='naive' the token recurrence: any platform and dtype;
  'pallas' the kernels here, one file per kind of recurrence, each a forward and a backward
           Pallas kernel in one `jax.custom_vjp` with the chunk form's signature
           `(q, k, v, g, beta, state, chunk_size) -> (out, final state)`:
             `scalar_decay`  a decay per head (retention, Mamba-2),
             `vector_decay`  a decay per key feature (GLA),
             `delta`         the delta rule with a decay per head or none (Gated DeltaNet,
                             DeltaNet).
           On CPU they run in Pallas's interpret mode (the tests), on GPU through Triton, on
           TPU through Mosaic. Chunkwise form only; q, k, v float32 or bfloat16.
  'auto'   `AUTO[platform]` where the kernel can take the call, else 'xla'.

An explicit 'pallas' the call cannot take (form='naive', a float16 input, a platform without
a Pallas back end) raises a one-line error naming the reason.
"""

from typing import Optional

import jax.numpy as jnp

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels.delta import delta_chunked
from efficient_attn.ops.kernels.scalar_decay import scalar_decay_chunked
from efficient_attn.ops.kernels.vector_decay import vector_decay_chunked

IMPLEMENTATIONS = ('auto', 'xla', 'pallas')
# What 'auto' takes per platform. Empty: 'xla' everywhere, because no measurement in
# docs/results/ shows a kernel faster yet (none has run on a GPU or TPU). A GPU (or TPU)
# measurement of forward + backward against the XLA chunk form fills it, e.g.
# {'gpu': 'pallas'}, with the result's file named in this comment.
AUTO = {}
RUNS_ON = ('cpu', 'gpu', 'tpu')  # cpu: interpreted (slow; for tests)


def why_not(*, form: str = 'chunk', dtype=jnp.float32, on: Optional[str] = None) -> Optional[str]:
  """Why the kernels cannot run this call, or None if they can."""
  on = on or common.platform()
  if form != 'chunk':
    return (
      f"form={form!r} is the token-by-token recurrence; the kernels compute the "
      f"chunkwise form (form='chunk')"
    )
  if jnp.dtype(dtype) not in common.DTYPES:
    return f'the kernels take float32 or bfloat16 q, k, v, not {jnp.dtype(dtype)}'
  if on not in RUNS_ON:
    return f'they run on {", ".join(RUNS_ON)}, and this backend is {on!r}'
  return None


def choose(
  requested: str, *, form: str = 'chunk', dtype=jnp.float32, on: Optional[str] = None
) -> str:
  """The implementation ('xla' or 'pallas') that runs a recurrence's call.

  requested: one of `IMPLEMENTATIONS`; form: the mechanism's form ('chunk' or 'naive');
  dtype: the dtype of q, k, v as the core receives them; on: the platform (default JAX's
  backend; tests pass it to fake one).
  """
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f'implementation={requested!r}; valid: {", ".join(IMPLEMENTATIONS)}')
  if requested == 'xla':
    return 'xla'
  on = on or common.platform()
  reason = why_not(form=form, dtype=dtype, on=on)
  if requested == 'auto':
    return 'xla' if reason else AUTO.get(on, 'xla')
  if reason:
    raise ValueError(f"implementation='pallas' cannot run this call: {reason}")
  return 'pallas'


def decay_chunked(q, k, v, g, beta=None, state=None, chunk_size: int = 64):
  """The decay recurrence by the kernels: `scalar_decay` for log-decays `[b, n, h, 1]`,
  `vector_decay` for `[b, n, h, dk]`; as `gated.gated_chunked`."""
  kernel = scalar_decay_chunked if g is not None and g.shape[-1] == 1 else vector_decay_chunked
  return kernel(q, k, v, g, beta, state, chunk_size)


__all__ = [
  'IMPLEMENTATIONS',
  'AUTO',
  'choose',
  'why_not',
  'decay_chunked',
  'delta_chunked',
  'scalar_decay_chunked',
  'vector_decay_chunked',
]

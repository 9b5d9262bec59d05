"""Pallas kernels of the gated recurrences' chunk forms, and the rule that picks one.

The five recurrences (retention, GLA, Mamba-2, DeltaNet, Gated DeltaNet) take
`implementation='auto' | 'xla' | 'pallas'` (`mechanisms.gated_family.common_options`),
resolved once per call by `choose`, as `efficient_attn.ops.fused_softmax` resolves softmax's:

  'xla'    the chunk form in XLA (`gated.gated_chunked`, `delta.delta_chunked`),
           or with form='naive' the token recurrence: any platform and dtype;
  'pallas' the kernels here, one entry per kind of recurrence, each a forward and a backward
           Pallas kernel in one `jax.custom_vjp`, with the recurrences' one signature
           (docs/design.md) `(q, k, v, log_decay, beta, *, initial_state, segment_ids,
           chunk_size, precision) -> (out, final state)`:
             `scalar_decay_chunked`  a decay per head or none (retention, Mamba-2),
             `vector_decay_chunked`  a decay per key feature (GLA),
             `delta_chunked`         the delta rule with a decay per head, per key
                                     feature or none (Gated DeltaNet, KDA, DeltaNet).
           The platform is chosen when lowering (`recurrence.py`): on TPU Mosaic, a grid
           over (rows, chunks) with the state in VMEM (`tpu.py`); on GPU Triton, one program
           per (row, value tile) looping over the chunks (`gpu.py`, tiles per compute
           capability: `gpu_blocks`); on CPU the Mosaic driver in Pallas's interpreter (the
           tests). Chunkwise form only; q, k, v float32 or bfloat16.
  'auto'   `AUTO[platform]` where the kernel can take the call, else 'xla'.

An explicit 'pallas' the call cannot take (form='naive', a float16 input, a platform without
a Pallas back end) raises a one-line error naming the reason.
"""

from typing import Dict, Optional

import jax
import jax.numpy as jnp

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels.common import PRECISIONS
from efficient_attn.ops.kernels.delta import delta_chunked
from efficient_attn.ops.kernels.gpu import gpu_blocks
from efficient_attn.ops.kernels.gpu import shared_memory_bytes
from efficient_attn.ops.kernels.scalar_decay import scalar_decay_chunked
from efficient_attn.ops.kernels.vector_decay import vector_decay_chunked

IMPLEMENTATIONS = ('auto', 'xla', 'pallas')
# What 'auto' takes per platform. Empty: 'xla' everywhere, because no measurement in
# docs/results/ shows a kernel faster yet (none has run on a GPU or TPU). A GPU (or TPU)
# measurement of forward + backward against the XLA chunk form fills it, e.g.
# {'gpu': 'pallas'}, with the result's file named in this comment.
AUTO: Dict[str, str] = {}
RUNS_ON = ('cpu', 'gpu', 'tpu')  # cpu: interpreted (slow; for tests)


def why_not(*, form: str = 'chunk', dtype=jnp.float32, on: Optional[str] = None) -> Optional[str]:
  """Why the kernels cannot run this call, or None if they can."""
  on = on or jax.default_backend()
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
  on = on or jax.default_backend()
  reason = why_not(form=form, dtype=dtype, on=on)
  if requested == 'auto':
    return 'xla' if reason else AUTO.get(on, 'xla')
  if reason:
    raise ValueError(f"implementation='pallas' cannot run this call: {reason}")
  return 'pallas'


def decay_chunked(q, k, v, log_decay=None, beta=None, **kwargs):
  """The decay recurrence by the kernels: `scalar_decay_chunked` for log-decays
  `[b, n, h, 1]` (or None), `vector_decay_chunked` for `[b, n, h, dk]`; as
  `gated.gated_chunked`."""
  per_feature = log_decay is not None and log_decay.shape[-1] > 1
  kernel = vector_decay_chunked if per_feature else scalar_decay_chunked
  return kernel(q, k, v, log_decay, beta, **kwargs)


__all__ = [
  'IMPLEMENTATIONS',
  'AUTO',
  'PRECISIONS',
  'choose',
  'why_not',
  'decay_chunked',
  'delta_chunked',
  'gpu_blocks',
  'scalar_decay_chunked',
  'shared_memory_bytes',
  'vector_decay_chunked',
]

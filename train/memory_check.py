"""A run whose attention weights cannot fit in this host's memory is refused before any work.

A mechanism that forms the n x n weights (declared memory 'O(n^2)': softmax's einsum form,
gMLP, Synthesizer) keeps one `[batch, heads, n, n]` float32 array per layer for the
backward pass, and evaluation forms one at the evaluation batch. The larger of the two is
a lower bound on the run's memory (XLA's own figure for a small encoder was 1.4-1.9x it).
Past the host's memory, the run would fail after its workdir is written, with XLA's
`RESOURCE_EXHAUSTED` (`configs/mqar.py:softmax,seq_len=16384` asked for 421 GB). `check`
refuses it first, in one line that names the numbers and a mechanism that fits.

Only on a CPU host: there the einsum form is what runs, and the devices share the host's
memory. On a GPU or TPU, softmax's 'auto' may pick a fused kernel that never forms the
weights, and the device's own limit is XLA's to report.
"""

import os
from typing import Optional

import jax

QUADRATIC = 'O(n^2)'
SCORE_BYTES = 4  # scores and weights are float32 in every mechanism


def host_bytes() -> Optional[int]:
  """The host's physical memory (not what is free now: a check that depends on other
  processes would refuse a run one minute and pass it the next); None where unknown."""
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return None


def weights_bytes(
  layers_quadratic: int, *, batch: int, eval_batch: int, heads: int, length: int
) -> int:
  """The lower bound: one `[batch, heads, n, n]` float32 array per quadratic layer kept
  for the backward pass, or one at the evaluation batch, whichever is larger."""
  per_row = heads * length * length * SCORE_BYTES
  return max(layers_quadratic * batch * per_row, eval_batch * per_row if layers_quadratic else 0)


def _gib(n: int) -> str:
  return f'{n / 2**30:,.1f} GiB'


def check(config, declarations, length: int, processes: int = 1) -> Optional[str]:
  """The one-line refusal, or None where the run may fit (or the check does not apply).

  config: the resolved run config (model.depth, model.num_heads, dataset.batch_size and
  eval_batch_size, attention.mechanism); declarations: the pattern's mechanisms, block i
  taking declarations[i % len]; length: the tokens the attention sees; processes: the
  processes that share the global batch.
  """
  if jax.default_backend() != 'cpu':
    return None
  # Reversible blocks recompute each block's activations in the backward pass: one at a time.
  depth = 1 if config.model.get('reversible') else int(config.model.depth)
  quadratic = [declarations[i % len(declarations)] for i in range(depth)]
  quadratic = [decl for decl in quadratic if decl.complexity[1] == QUADRATIC]
  if not quadratic:
    return None
  batch = max(int(config.dataset.batch_size) // processes, 1)
  eval_batch = max(int(config.dataset.get('eval_batch_size') or batch) // processes, 1)
  heads = int(config.model.num_heads)
  need = weights_bytes(
    len(quadratic), batch=batch, eval_batch=eval_batch, heads=heads, length=length
  )
  have = host_bytes()
  if have is None or need <= have:
    return None
  names = sorted({decl.name for decl in quadratic})
  return (
    f'config.attention.mechanism={config.attention.mechanism!r} at {length:,} tokens needs '
    f'at least {_gib(need)} for the n x n weights of {", ".join(names)} '
    f'({len(quadratic)} layer(s) x batch {batch} (evaluation: {eval_batch}) x {heads} heads x '
    f'{length:,}^2 float32), over the {_gib(have)} of the host memory; softmax_chunked '
    f'computes exact softmax attention in O(n) memory (--config.attention.mechanism='
    f'softmax_chunked), or lower config.dataset.batch_size and eval_batch_size, or the length'
  )

"""benchmarks.fla_peer's side of this library: the chunk forms ('xla' and 'pallas') timed
forward + backward, and one decoding step."""

import time
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import timing
from efficient_attn.ops import delta
from efficient_attn.ops import gated
from efficient_attn.ops import kernels


def our_core(recurrence: str, implementation: str) -> Optional[Callable[..., Any]]:
  """`core(q, k, v, g, beta, state=None, chunk_size=c) -> (out, state)` of the chunk form:
  the XLA form ('xla') or the Pallas kernels ('pallas', `efficient_attn.ops.kernels`)."""
  is_delta = recurrence in ('deltanet', 'gated_deltanet')
  if implementation == 'xla':
    return delta.delta_chunked if is_delta else gated.gated_chunked
  return kernels.delta_chunked if is_delta else kernels.decay_chunked


def our_step(recurrence: str) -> Callable[..., Any]:
  return delta.delta_step if recurrence in ('deltanet', 'gated_deltanet') else gated.gated_step


def memory_bytes(compiled) -> Optional[int]:
  """Arguments + outputs + temporaries of a compiled program (None where XLA says nothing)."""
  try:
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)
  except Exception:  # pylint: disable=broad-except
    return None


def time_ours(
  core, q, k, v, g, beta, *, dtype: str, chunk_size: int, repeats: int, budget_s: float
) -> Dict[str, Any]:
  """Forward + backward of `core` on the inputs cast to `dtype` (gates stay float32)."""
  cast = lambda x: None if x is None else jnp.asarray(x, dtype)
  q, k, v = (cast(x) for x in (q, k, v))
  g, beta = (None if x is None else jnp.asarray(x) for x in (g, beta))
  do = jnp.ones(v.shape, jnp.float32)

  def loss(q, k, v, g, beta):
    out, _ = core(q, k, v, g, beta, chunk_size=chunk_size)
    return jnp.sum(out.astype(jnp.float32) * do)

  grad = jax.jit(
    jax.grad(loss, argnums=tuple(i for i, x in enumerate((q, k, v, g, beta)) if x is not None))
  )
  start = time.perf_counter()
  compiled = grad.lower(q, k, v, g, beta).compile()
  compile_s = time.perf_counter() - start
  timed = timing.time_compiled(compiled, (q, k, v, g, beta), repeats=repeats, budget_s=budget_s)
  return dict(time_s=timed['time_s'], compile_s=compile_s, memory_bytes=memory_bytes(compiled))


def time_our_step(recurrence: str, q, k, v, g, beta, *, repeats: int) -> float:
  """Seconds per decoding step (batch, heads and widths of the inputs), float32 state."""
  step = jax.jit(our_step(recurrence))
  b, _, h, dk = q.shape
  s = jnp.zeros((b, h, dk, v.shape[-1]), jnp.float32)
  first = lambda x: None if x is None else jnp.asarray(x[:, 0])  # token 0: [b, h, ...]
  args = (s, first(q), first(k), first(v), first(g), first(beta))
  timing.block(step(*args))
  times = []
  for _ in range(max(1, repeats)):
    start = time.perf_counter()
    timing.block(step(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))

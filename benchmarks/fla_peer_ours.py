"""benchmarks.fla_peer's side of this library: the chunk forms ('xla' and 'pallas') timed
forward + backward, and one decoding step."""

import time
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import fla_peer_inputs
from benchmarks import timing
from efficient_attn.ops import delta
from efficient_attn.ops import dplr
from efficient_attn.ops import gated
from efficient_attn.ops.delta import product
from efficient_attn.ops.gated.common import Cores


def _cores(recurrence: str) -> Cores:
  """The forms of a recurrence (`Cores`: chunked, step, pallas)."""
  if recurrence == 'gated_deltaproduct':
    return product.householder_cores(delta.DELTA.pallas)
  if recurrence == 'rwkv7':
    return dplr.DPLR
  if recurrence in fla_peer_inputs.DELTA_RULES:
    return delta.DELTA
  return gated.DECAY


def _in_substeps(core: Callable[..., Any]) -> Callable[..., Any]:
  """Gated DeltaProduct's chunk form with `chunk_size` counting substeps (n_h a token), as
  fla's chunk_gated_delta_product's 64: chunk_size // n_h tokens a chunk."""

  def form(q, k, v, g=None, beta=None, *, chunk_size=64, **kw):
    return core(q, k, v, g, beta, chunk_size=max(1, chunk_size // k.shape[3]), **kw)

  return form


def our_core(recurrence: str, implementation: str) -> Optional[Callable[..., Any]]:
  """`core(q, k, v, g, beta, state=None, chunk_size=c) -> (out, state)` of the chunk form:
  the XLA form ('xla') or the Pallas kernels ('pallas', `efficient_attn.ops.kernels`), None
  where the recurrence has none (RWKV-7's DPLR has no Pallas kernel). Gated DeltaProduct's
  chunk_size counts substeps (fla's), so its chunks hold chunk_size // n_h tokens."""
  cores = _cores(recurrence)
  core = cores.chunked if implementation == 'xla' else cores.pallas
  if core is not None and recurrence == 'gated_deltaproduct':
    return _in_substeps(core)
  return core


def our_step(recurrence: str) -> Callable[..., Any]:
  return _cores(recurrence).step


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
  do = jnp.ones(q.shape[:3] + v.shape[-1:], jnp.float32)  # out's `[b, n, h, dv]`

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

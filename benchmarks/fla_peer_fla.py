"""benchmarks.fla_peer's side of flash-linear-attention: fla's chunk ops (PyTorch +
Triton) timed forward + backward with CUDA events, and its fused recurrent step."""

import time
from typing import Any, Dict

import numpy as np

FLA_OPS = {
  'retention': 'chunk_retention',
  'mamba2': 'chunk_simple_gla',
  'gla': 'chunk_gla',
  'deltanet': 'chunk_delta_rule',
  'gated_deltanet': 'chunk_gated_delta_rule',
}
FLA_STEPS = {
  'retention': 'fused_recurrent_retention',
  'mamba2': 'fused_recurrent_simple_gla',
  'gla': 'fused_recurrent_gla',
  'deltanet': 'fused_recurrent_delta_rule',
  'gated_deltanet': 'fused_recurrent_gated_delta_rule',
}


def fla_call(ops, recurrence: str, q, k, v, g, beta, *, step: bool = False, state=None):
  """One call of fla's chunk op (or, with `step`, its fused recurrent op) on torch tensors
  `[B, T, H, D]`: returns (out, final state)."""
  name = (FLA_STEPS if step else FLA_OPS)[recurrence]
  module = getattr(
    ops,
    {'mamba2': 'simple_gla', 'deltanet': 'delta_rule', 'gated_deltanet': 'gated_delta_rule'}.get(
      recurrence, recurrence
    ),
  )
  fn = getattr(module, name)
  kw = dict(scale=1.0, initial_state=state, output_final_state=True)
  if recurrence == 'retention':
    return fn(q, k, v, **kw)
  if recurrence == 'gla':
    return fn(q, k, v, gk=g, **kw) if step else fn(q, k, v, g=g, **kw)
  if recurrence == 'mamba2':
    return fn(q, k, v, g=g[..., 0], **kw)
  if recurrence == 'deltanet':
    return fn(q, k, v, beta=beta, **kw)
  return fn(q, k, v, g=g[..., 0], beta=beta, **kw)


def time_fla(ops, recurrence: str, q, k, v, g, beta, *, repeats: int) -> Dict[str, Any]:
  """fla's forward + backward (bfloat16 q, k, v; float32 gates) with CUDA events, its peak
  memory, and one decoding step's latency."""
  import torch  # pylint: disable=g-import-not-at-top

  dev = 'cuda'
  bf = lambda x: torch.tensor(x, device=dev, dtype=torch.bfloat16).requires_grad_()
  f32 = lambda x: None if x is None else torch.tensor(x, device=dev).requires_grad_()
  tq, tk, tv = bf(q), bf(k), bf(v)
  tg, tb = f32(g), f32(beta)
  do = torch.ones_like(tv)

  def once():
    out, _ = fla_call(ops, recurrence, tq, tk, tv, tg, tb)
    out.backward(do)

  once()
  torch.cuda.synchronize()
  torch.cuda.reset_peak_memory_stats()
  base = torch.cuda.memory_allocated()
  times = []
  for _ in range(max(1, repeats)):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    once()
    end.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
  peak = torch.cuda.max_memory_allocated() - base
  return dict(time_s=float(np.median(times)), memory_bytes=int(peak))


def time_fla_step(ops, recurrence: str, q, k, v, g, beta, *, repeats: int) -> float:
  """Seconds per token of fla's fused recurrent op with a state (bfloat16 inputs)."""
  import torch  # pylint: disable=g-import-not-at-top

  one = lambda x, dt=torch.bfloat16: (
    None if x is None else torch.tensor(x[:, :1], device='cuda', dtype=dt)
  )
  tq, tk, tv, tg, tb = one(q), one(k), one(v), one(g, torch.float32), one(beta, torch.float32)
  state = torch.zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3], device='cuda')
  with torch.no_grad():
    fla_call(ops, recurrence, tq, tk, tv, tg, tb, step=True, state=state)
    torch.cuda.synchronize()
    times = []
    for _ in range(max(1, repeats)):
      start = time.perf_counter()
      fla_call(ops, recurrence, tq, tk, tv, tg, tb, step=True, state=state)
      torch.cuda.synchronize()
      times.append(time.perf_counter() - start)
  return float(np.median(times))

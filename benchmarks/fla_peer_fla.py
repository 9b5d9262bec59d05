"""benchmarks.fla_peer's side of flash-linear-attention: fla's chunk ops (PyTorch +
Triton) timed forward + backward with CUDA events, and its fused recurrent step."""

import time
from typing import Any, Dict

import numpy as np

FLA_OPS = {
  'retention': 'retention.chunk_retention',
  'mamba2': 'simple_gla.chunk_simple_gla',
  'gla': 'gla.chunk_gla',
  'deltanet': 'delta_rule.chunk_delta_rule',
  'gated_deltanet': 'gated_delta_rule.chunk_gated_delta_rule',
  'kda': 'kda.chunk_kda',
  'gated_deltaproduct': 'gated_delta_product.chunk_gated_delta_product',
  'rwkv7': 'rwkv7.chunk_rwkv7',
}
# fla's layers decode Gated DeltaProduct with the gated delta rule's fused recurrent op on
# the token's substeps (it has no op of its own), RWKV-7 with the DPLR one.
FLA_STEPS = {
  'retention': 'retention.fused_recurrent_retention',
  'mamba2': 'simple_gla.fused_recurrent_simple_gla',
  'gla': 'gla.fused_recurrent_gla',
  'deltanet': 'delta_rule.fused_recurrent_delta_rule',
  'gated_deltanet': 'gated_delta_rule.fused_recurrent_gated_delta_rule',
  'kda': 'kda.fused_recurrent_kda',
  'gated_deltaproduct': 'gated_delta_rule.fused_recurrent_gated_delta_rule',
  'rwkv7': 'rwkv7.fused_recurrent_rwkv7',
}
# Keyword arguments of fla's op beside the inputs: RWKV-7's chunk op as fla's RWKV7Attention
# calls it (its log-decay is >= -exp(-1/2), the bound that licenses safe_gate).
FLA_EXTRA = {
  ('rwkv7', False): dict(safe_gate=True, lower_bound=-float(np.exp(-0.5)), chunk_size=64),
}
# The inputs fla reads in bfloat16 (the others float32, as the gates of the older ops).
BFLOAT16 = ('q', 'k', 'v', 'r', 'a', 'b')


def substeps(x, n_h: int):
  """`[b, n, h, n_h, ...]` -> fla's `[b, n n_h, h, ...]` (token t's step j at t n_h + j)."""
  b, n, h = x.shape[:3]
  return np.moveaxis(x, 3, 2).reshape((b, n * n_h, h) + x.shape[4:])


def fla_inputs(recurrence: str, q, k, v, g, beta, *, step: bool = False) -> Dict[str, Any]:
  """Our inputs (`fla_peer_inputs.inputs`) as fla's op reads them, by keyword: NumPy arrays
  `[B, T, H, ...]`. The same math: Gated DeltaProduct's keys, values and betas a token laid
  out as fla's substeps (with `step`, fla's layer's decoding: q at each token's last substep,
  g at its first); RWKV-7's pairs (a, b) and log-decay w."""
  if recurrence == 'rwkv7':
    return dict(r=q, w=g, k=k, v=v, a=beta[..., 0, :], b=beta[..., 1, :])
  x = dict(q=q, k=k, v=v)
  if recurrence == 'gla' and step:
    x['gk'] = g
  elif recurrence in ('gla', 'kda'):
    x['g'] = g
  elif g is not None and recurrence != 'retention':
    x['g'] = g[..., 0]
  if beta is not None:
    x['beta'] = beta
  if recurrence == 'gated_deltaproduct':
    n_h = k.shape[3]
    x.update(k=substeps(k, n_h), v=substeps(v, n_h), beta=substeps(beta[..., None], n_h)[..., 0])
    if step:
      last, first = np.zeros((n_h,) + q.shape, q.dtype), np.zeros((n_h,) + g.shape, g.dtype)
      last[-1], first[0] = q, g
      x.update(q=substeps(np.moveaxis(last, 0, 3), n_h), g=substeps(np.moveaxis(first, 0, 3), n_h))
      x['g'] = x['g'][..., 0]
    else:
      x['num_householder'] = n_h
  return x


def fla_call(ops, recurrence: str, x: Dict[str, Any], *, step: bool = False, state=None):
  """One call of fla's chunk op (or, with `step`, its fused recurrent op) on the torch
  tensors `x` (`fla_inputs`, converted): returns (out `[B, T, H, V]`, final state)."""
  module, name = (FLA_STEPS if step else FLA_OPS)[recurrence].split('.')
  fn = getattr(getattr(ops, module), name)
  out, final = fn(
    **x,
    scale=1.0,
    initial_state=state,
    output_final_state=True,
    **FLA_EXTRA.get((recurrence, step), {}),
  )
  return out, final


def _torch(x: Dict[str, Any], device: str, *, grad: bool) -> Dict[str, Any]:
  """`fla_inputs` as torch tensors on `device`: bfloat16 where fla's layers give it
  (`BFLOAT16`), float32 otherwise (ints pass); leaves that take a gradient with `grad`."""
  import torch  # pylint: disable=g-import-not-at-top

  out = {}
  for name, value in x.items():
    if not isinstance(value, np.ndarray):
      out[name] = value
      continue
    dtype = torch.bfloat16 if name in BFLOAT16 else torch.float32
    out[name] = torch.tensor(value, device=device, dtype=dtype).requires_grad_(grad)
  return out


def time_fla(ops, recurrence: str, q, k, v, g, beta, *, repeats: int) -> Dict[str, Any]:
  """fla's forward + backward (bfloat16 q, k, v; float32 gates) with CUDA events, and its
  peak memory."""
  import torch  # pylint: disable=g-import-not-at-top

  x = _torch(fla_inputs(recurrence, q, k, v, g, beta), 'cuda', grad=True)
  do = torch.ones(q.shape[:3] + v.shape[-1:], device='cuda', dtype=torch.bfloat16)

  def once():
    out, _ = fla_call(ops, recurrence, x)
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
  """Seconds per token of fla's fused recurrent op with a float32 state (bfloat16 inputs)."""
  import torch  # pylint: disable=g-import-not-at-top

  first = lambda a: None if a is None else a[:, :1]
  x = fla_inputs(recurrence, *(first(a) for a in (q, k, v, g, beta)), step=True)
  x = _torch(x, 'cuda', grad=False)
  state = torch.zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[-1], device='cuda')
  with torch.no_grad():
    fla_call(ops, recurrence, x, step=True, state=state)
    torch.cuda.synchronize()
    times = []
    for _ in range(max(1, repeats)):
      start = time.perf_counter()
      fla_call(ops, recurrence, x, step=True, state=state)
      torch.cuda.synchronize()
      times.append(time.perf_counter() - start)
  return float(np.median(times))

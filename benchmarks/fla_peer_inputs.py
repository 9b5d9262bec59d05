"""benchmarks.fla_peer's problems: each recurrence's head shapes in a layout, and random
inputs, the same for both sides."""

from typing import Dict

import numpy as np


def shapes(recurrence: str, layout: str, heads: int, head_dim: int) -> Dict[str, int]:
  """heads, dk, dv (and qk_groups: heads sharing one q/k) of a recurrence in a layout."""
  if layout == 'paper' and recurrence == 'mamba2':
    return dict(heads=32, dk=128, dv=64, qk_groups=1)
  if layout == 'paper' and recurrence == 'gated_deltanet':
    return dict(heads=6, dk=256, dv=512, qk_groups=6)
  return dict(heads=heads, dk=head_dim, dv=head_dim, qk_groups=heads)


def inputs(recurrence: str, batch: int, length: int, s: Dict[str, int], seed: int = 0):
  """Float32 NumPy q, k, v `[b, n, h, d]`, log-decay g (`[b, n, h, 1]` or `[b, n, h, dk]`, or
  None) and beta (`[b, n, h]` or None), as the mechanisms make them: keys L2-normalised for
  the delta rule, decays in a trained model's range."""
  rng = np.random.default_rng(seed)
  b, n, h, dk, dv = batch, length, s['heads'], s['dk'], s['dv']
  q, k = (rng.standard_normal((b, n, s['qk_groups'], dk), np.float32) for _ in range(2))
  q, k = (np.repeat(x, h // s['qk_groups'], axis=2) for x in (q, k))
  v = rng.standard_normal((b, n, h, dv), np.float32)
  g = beta = None
  if recurrence == 'retention':
    g = np.broadcast_to(
      np.log1p(-(2.0 ** (-5.0 - np.arange(h, dtype=np.float32))))[:, None], (b, n, h, 1)
    ).copy()
  elif recurrence in ('mamba2', 'gated_deltanet'):
    g = -rng.uniform(0.001, 0.1, (b, n, h, 1)).astype(np.float32)
  elif recurrence == 'gla':
    g = np.log(rng.uniform(0.9, 1.0, (b, n, h, dk))).astype(np.float32)
  if recurrence in ('deltanet', 'gated_deltanet'):
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    beta = rng.uniform(0.1, 0.9, (b, n, h)).astype(np.float32)
  q = q / np.sqrt(dk)  # the mechanisms scale queries (fla: scale=1 below)
  return q, k, v, g, beta

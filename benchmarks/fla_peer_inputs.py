"""benchmarks.fla_peer's problems: each recurrence's head shapes in a layout, and random
inputs, the same for both sides."""

from typing import Dict

import numpy as np

DELTA_RULES = ('deltanet', 'gated_deltanet', 'kda', 'gated_deltaproduct')
NUM_HOUSEHOLDER = 2  # Gated DeltaProduct's steps a token (fla's GatedDeltaProduct layer: 2)
RWKV7_DECAY = np.exp(-0.5)  # RWKV-7's log-decay is -exp(-1/2) sigmoid(.): in (-0.607, 0)


def shapes(recurrence: str, layout: str, heads: int, head_dim: int) -> Dict[str, int]:
  """heads, dk, dv (and qk_groups: heads sharing one q/k; num_householder: Gated
  DeltaProduct's steps a token) of a recurrence in a layout."""
  if layout == 'paper' and recurrence == 'mamba2':
    return dict(heads=32, dk=128, dv=64, qk_groups=1)
  if layout == 'paper' and recurrence == 'gated_deltanet':
    return dict(heads=6, dk=256, dv=512, qk_groups=6)
  s = dict(heads=heads, dk=head_dim, dv=head_dim, qk_groups=heads)
  if recurrence == 'gated_deltaproduct':
    s['num_householder'] = NUM_HOUSEHOLDER
  return s


def _l2(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def inputs(recurrence: str, batch: int, length: int, s: Dict[str, int], seed: int = 0):
  """Float32 NumPy q, k, v, log-decay g and beta as the mechanisms make them: keys
  L2-normalised for the delta rule, decays in a trained model's range.

  q `[b, n, h, dk]`; k, v `[b, n, h, d]` (Gated DeltaProduct: `[b, n, h, n_h, d]`, n_h keys
  and values a token); g `[b, n, h, 1]`, `[b, n, h, dk]` (GLA, KDA, RWKV-7) or None; beta
  `[b, n, h]` in (0, 1) (Gated DeltaProduct: `[b, n, h, n_h]` in (0, 2), fla's layer's
  allow_neg_eigval), for RWKV-7 the low-rank pairs `[b, n, h, 2, dk]`: (a, b) = (-kappa,
  alpha * kappa) with kappa L2-normalised and alpha in (0, 1), or None.
  """
  rng = np.random.default_rng(seed)
  b, n, h, dk, dv = batch, length, s['heads'], s['dk'], s['dv']
  n_h = s.get('num_householder')
  q, k = (rng.standard_normal((b, n, s['qk_groups'], dk), np.float32) for _ in range(2))
  q, k = (np.repeat(x, h // s['qk_groups'], axis=2) for x in (q, k))
  v = rng.standard_normal((b, n, h, dv), np.float32)
  if n_h:
    k = rng.standard_normal((b, n, h, n_h, dk), np.float32)
    v = rng.standard_normal((b, n, h, n_h, dv), np.float32)
  g = beta = None
  if recurrence == 'retention':
    g = np.broadcast_to(
      np.log1p(-(2.0 ** (-5.0 - np.arange(h, dtype=np.float32))))[:, None], (b, n, h, 1)
    ).copy()
  elif recurrence in ('mamba2', 'gated_deltanet', 'gated_deltaproduct'):
    g = -rng.uniform(0.001, 0.1, (b, n, h, 1)).astype(np.float32)
  elif recurrence in ('gla', 'kda'):
    g = np.log(rng.uniform(0.9, 1.0, (b, n, h, dk))).astype(np.float32)
  elif recurrence == 'rwkv7':
    g = (-RWKV7_DECAY * _sigmoid(rng.standard_normal((b, n, h, dk)))).astype(np.float32)
    kappa = _l2(rng.standard_normal((b, n, h, dk)))
    alpha = _sigmoid(rng.standard_normal((b, n, h, dk)))
    beta = np.stack([-kappa, alpha * kappa], axis=3).astype(np.float32)
  if recurrence in DELTA_RULES:
    k = _l2(k)
    high = 1.9 if n_h else 0.9
    beta = rng.uniform(0.1, high, (b, n, h) + ((n_h,) if n_h else ())).astype(np.float32)
  q = (q / np.sqrt(dk)).astype(np.float32)  # as the mechanisms (fla: scale=1; RWKV-7 r alike)
  return q, k, v, g, beta

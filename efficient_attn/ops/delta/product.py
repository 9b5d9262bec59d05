"""Gated DeltaProduct (Siems et al. 2025) on the gated delta rule: n_h delta steps a token.

Each token t takes n_h Householder-like steps, each with its own key, value and beta, and
one decay a_t before them (Gated DeltaProduct; n_h = 1 is Gated DeltaNet):

    S_{t,0} = a_t S_{t-1},
    S_{t,j} = (I - beta_{t,j} k_{t,j} k_{t,j}^T) S_{t,j-1} + beta_{t,j} k_{t,j} v_{t,j}^T,
    S_t = S_{t,n_h},    o_t = S_t^T q_t,

so the state transition of a token is a_t prod_j (I - beta_{t,j} k_{t,j} k_{t,j}^T), the
latest on the left. That is the delta rule on n * n_h substeps, token t's substep j at
position t n_h + j (`interleave`): the log-decay on substep 0 and 0 on the others, the
query read at substep n_h - 1 (`read_out`), as fla's fused recurrent form of its layer.
Every form of the delta rule (`efficient_attn.ops.delta`: token scan, WY chunks, Pallas
kernels, decoding step, sequence-parallel transitions) serves it unchanged: `householder`
wraps one, and a chunk of c tokens is a chunk of c n_h substeps of the wrapped form.

Shapes: q `[b, n, h, dk]`, k `[b, n, h, n_h, dk]`, v `[b, n, h, n_h, dv]`, beta
`[b, n, h, n_h]`, log-decays `[b, n, h, 1]` or None, segment ids `[b, n]`; states
`[b, h, dk, dv]`, as the delta rule's.
"""

from typing import Any, Callable, Optional

import jax.numpy as jnp

from efficient_attn.ops.delta.chunk import delta_chunked
from efficient_attn.ops.delta.reference import delta_scan
from efficient_attn.ops.delta.reference import delta_step
from efficient_attn.ops.delta.sharded import transition_sharded
from efficient_attn.ops.gated.common import Cores
from efficient_attn.ops.gated.reference import zero_state


def interleave(q, k, v, g=None, beta=None, segment_ids=None):
  """The n_h substeps of every token in a row: (q, k, v, g, beta, segment_ids) of length
  n n_h, token t's substep j at t n_h + j.

  q `[b, n, h, dk]` -> `[b, n n_h, h, dk]`, q_t at substep n_h - 1 and 0 elsewhere;
  k `[b, n, h, n_h, dk]` -> `[b, n n_h, h, dk]`; v likewise with dv;
  g `[b, n, h, 1]` (or None) -> `[b, n n_h, h, 1]`, g_t at substep 0 and 0 elsewhere;
  beta `[b, n, h, n_h]` -> `[b, n n_h, h]`; segment_ids `[b, n]` -> `[b, n n_h]`, each
  token's id on its substeps (None passes).
  """
  b, n, h, n_h, _ = k.shape
  substeps = lambda x: jnp.moveaxis(x, 3, 2).reshape((b, n * n_h, h) + x.shape[4:])

  def at(x, j):  # x `[b, n, h, ...]` at substep j, 0 at the others
    placed = jnp.zeros((n_h,) + x.shape, x.dtype).at[j].set(x)
    return jnp.moveaxis(placed, 0, 2).reshape((b, n * n_h) + x.shape[2:])

  return (
    at(q, n_h - 1),
    substeps(k),
    substeps(v),
    None if g is None else at(g, 0),
    None if beta is None else substeps(beta[..., None])[..., 0],
    None if segment_ids is None else jnp.repeat(segment_ids, n_h, axis=1),
  )


def read_out(out, n_h: int):
  """The tokens' outputs `[b, n, h, dv]` from the substeps' `[b, n n_h, h, dv]`: each
  token's last substep (t n_h + n_h - 1), where its query is read."""
  b, m, h, dv = out.shape
  return out.reshape(b, m // n_h, n_h, h, dv)[:, :, -1]


class Householder:
  """A form of the delta rule (`substeps`, the recurrences' signature: `delta_chunked`,
  `delta_scan` or the Pallas kernels) run as Gated DeltaProduct: the tokens' inputs
  interleaved into substeps, the outputs read at each token's last. `chunk_size` counts
  tokens: the wrapped form's chunks are chunk_size * n_h substeps.

  (q, k, v, g=None, beta=None, *, initial_state=None, segment_ids=None, chunk_size=64) ->
  (out `[b, n, h, dv]`, final S `[b, h, dk, dv]`), shapes as the module says."""

  def __init__(self, substeps: Callable[..., Any]):
    self.substeps = substeps

  def __call__(
    self, q, k, v, g=None, beta=None, *, initial_state=None, segment_ids=None, chunk_size=64
  ):
    n_h = k.shape[3]
    q, k, v, g, beta, ids = interleave(q, k, v, g, beta, segment_ids)
    out, state = self.substeps(
      q,
      k,
      v,
      g,
      beta,
      initial_state=initial_state,
      segment_ids=ids,
      chunk_size=None if chunk_size is None else chunk_size * n_h,
    )
    return read_out(out, n_h), state


def householder_step(s, q_t, k_t, v_t, g_t, beta_t):
  """One token of decoding: its n_h delta steps (`delta_step`), the decay before the
  first. s `[b, h, dk, dv]`; q_t `[b, h, dk]`; k_t `[b, h, n_h, dk]`; v_t `[b, h, n_h, dv]`;
  g_t `[b, h, 1]` or None; beta_t `[b, h, n_h]`. Returns (S, o_t `[b, h, dv]`)."""
  out = None
  for j in range(k_t.shape[2]):
    s, out = delta_step(s, q_t, k_t[:, :, j], v_t[:, :, j], g_t if j == 0 else None, beta_t[..., j])
  return s, out


def householder_sharded(
  core: Householder, q, k, v, g, beta, *, segment_ids=None, chunk_size: int, axis: str
):
  """Gated DeltaProduct on this device's block of a sequence split over mesh axis `axis`:
  the delta rule's composed transitions (`transition_sharded`) on the block's substeps,
  by the form `core` wraps. Shapes as `Householder`'s (this block's); returns out
  `[b, m, h, dv]`."""
  n_h = k.shape[3]
  q, k, v, g, beta, ids = interleave(q, k, v, g, beta, segment_ids)
  out = transition_sharded(
    core.substeps, q, k, v, g, beta, segment_ids=ids, chunk_size=chunk_size * n_h, axis=axis
  )
  return read_out(out, n_h)


def householder_cores(pallas: Optional[Callable[..., Any]] = None) -> Cores:
  """Gated DeltaProduct's forms (`Cores`): the delta rule's scan, WY chunks and (`pallas`)
  Pallas kernels wrapped by `Householder`, the decoding step `householder_step`."""
  return Cores(
    Householder(delta_scan),
    Householder(delta_chunked),
    householder_step,
    zero_state,
    None if pallas is None else Householder(pallas),
  )

"""Packed rows (`segment_ids`) in kernel attention: the sums restart at each document.

Causal kernel attention is the decay recurrence of `efficient_attn.ops.gated` with no decay
(RFA's gate: its log as the decay) read twice: the numerator num_q^T S, and the denominator
phi_q . Z, the same recurrence on values of ones. So a packed row runs through
`gated.gated_chunked`, which confines each token to its document (docs/design.md,
"Documents"): a padding token (id 0) writes nothing and reads 0. The bidirectional form is
the causal one run forwards and backwards, less each token's own term, counted twice.

Shapes: features `[batch, length, heads, f]`, v `[batch, length, heads, dv]`, segment ids
`[batch, length]` int (0: padding); outputs `[batch, length, heads, dv]`; states (S `[batch,
heads, f, dv]`, Z `[batch, heads, f]`): the last document's.
"""

from typing import Optional

import jax.numpy as jnp

from efficient_attn.ops.gated import documents
from efficient_attn.ops.gated.chunk import gated_chunked
from efficient_attn.ops.gated.sharded import decayed_sharded
from efficient_attn.ops.linear_attention import common
from efficient_attn.ops.linear_attention.common import KernelFeatures


def _sums(
  features: KernelFeatures, v, log_g, segment_ids, chunk_size: int, initial=None, axis=None
):
  """(numerator `[b, n, h, dv]`, denominator `[b, n, h]`, (S, Z)) of the causal recurrence
  on prepared inputs, each token reading only its document. With `axis` (this device's
  block of a row split over that mesh axis, `gated.decayed_sharded`), no state: (S, Z) is
  (None, None)."""
  g = None if log_g is None else log_g[..., None]

  def run(q, k, values, state):
    if axis is None:
      return gated_chunked(
        q, k, values, g, None, initial_state=state, segment_ids=segment_ids, chunk_size=chunk_size
      )
    out = decayed_sharded(
      gated_chunked, q, k, values, g, segment_ids=segment_ids, chunk_size=chunk_size, axis=axis
    )
    return out, None

  last = lambda state, i: None if state is None else state[..., i]
  ones = jnp.ones(v.shape[:3] + (1,), v.dtype)
  s0, z0 = (None, None) if initial is None else initial
  if not features.has_numerator:  # one recurrence: the ones ride along as a last value
    state = None if initial is None else jnp.concatenate([initial[0], initial[1][..., None]], -1)
    out, state = run(features.phi_q, features.phi_k, jnp.concatenate([v, ones], -1), state)
    s = None if state is None else state[..., :-1]
    return out[..., :-1], out[..., -1], (s, last(state, -1))
  num_q, num_k = features.numerator()
  num, s = run(num_q, num_k, v, s0)
  den, z = run(features.phi_q, features.phi_k, ones, None if z0 is None else z0[..., None])
  return num, den[..., 0], (s, last(z, 0))


def causal_packed(
  features: KernelFeatures,
  v: jnp.ndarray,
  log_g: Optional[jnp.ndarray],
  segment_ids: jnp.ndarray,
  *,
  eps: float,
  normalize: bool,
  chunk_size: int,
  initial=None,
  axis: Optional[str] = None,
):
  """Causal kernel attention on packed rows, from `common.prepare`d inputs (padding's keys
  zeroed, gated keys scaled): (out `[b, n, h, dv]` in the compute dtype, the last
  document's (S, Z)). `initial` (S, Z) continues into each row's first document. `axis`:
  the inputs are this device's block of rows split over that mesh axis (inside
  `jax.shard_map`); documents may cross the blocks' edges, and (S, Z) is (None, None)."""
  num, den, state = _sums(features, v, log_g, segment_ids, chunk_size, initial, axis)
  return (common.normalize_by(num, den, eps) if normalize else num), state


def bidirectional_packed(
  features: KernelFeatures,
  v: jnp.ndarray,
  segment_ids: jnp.ndarray,
  *,
  eps: float,
  normalize: bool,
  chunk_size: int,
):
  """Bidirectional kernel attention on packed rows (prepared inputs): each token reads every
  token of its document. (out `[b, n, h, dv]`, the last document's (S, Z))."""
  flip = lambda x: jnp.flip(x, axis=1)
  num, den, state = _sums(features, v, None, segment_ids, chunk_size)
  back = KernelFeatures(
    flip(features.phi_q),
    flip(features.phi_k),
    *(None if x is None else flip(x) for x in (features.num_q, features.num_k)),
  )
  num_back, den_back, _ = _sums(back, flip(v), None, flip(segment_ids), chunk_size)
  num_q, num_k = features.numerator()
  own = jnp.einsum('bnhf,bnhf->bnh', num_q, num_k)  # 0 at padding: its keys are zeroed
  num = num + flip(num_back) - own[..., None] * v
  den = den + flip(den_back) - jnp.einsum('bnhf,bnhf->bnh', features.phi_q, features.phi_k)
  return (common.normalize_by(num, den, eps) if normalize else num), state


def zero_padding(segment_ids, *xs):
  """Each `[batch, length, ...]` array of xs with the padding of `segment_ids` (id 0) set to
  0 by `where` (`gated.documents.zero_padding`; None: xs unchanged): a pure function's
  inputs before its feature map, so that NaN there reaches no gradient (the map's own
  included)."""
  real = None if segment_ids is None else jnp.asarray(segment_ids) != 0
  return documents.zero_padding(real, *xs)

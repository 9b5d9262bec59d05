"""The recurrent form of causal kernel attention: one decoding step on a carried state.

The causal form's prefix sums S_t = sum_{j<=t} phi_k_j v_j^T, Z_t = sum_{j<=t} phi_k_j are
the hidden state of an RNN (Katharopoulos et al. 2020, "Transformers are RNNs"):
`kernel_attention_step` adds one token and reads the state in O(f dv) per (batch, head),
independent of the position.
"""

from typing import NamedTuple, Optional

import jax.numpy as jnp

from efficient_attn.ops import masking
from efficient_attn.ops.linear_attention.common import KernelFeatures
from efficient_attn.ops.linear_attention.common import compute_dtype
from efficient_attn.ops.linear_attention.common import normalize_by


class KernelState(NamedTuple):
  """Recurrent state of causal kernel attention for one layer (a pytree).

  Attributes:
    s: S = sum_j phi(k_j) v_j^T, `[batch, heads, f, dv]`.
    z: Z = sum_j phi(k_j), `[batch, heads, f]`.
    log_scale: `[batch, heads]`; only Performer's positive features use it: the
      running key stabiliser (s and z hold the sums of features scaled by
      exp(-log_scale)). Starts at a large negative number (no key seen yet);
      the other feature maps carry it through untouched.
    segment: optional `[batch]` int32, a layer's packed stream: the segment id of the
      last real token (0: none yet; `KernelMechanism.step`). None for the pure functions.
  """

  s: jnp.ndarray
  z: jnp.ndarray
  log_scale: jnp.ndarray
  segment: Optional[jnp.ndarray] = None


def init_kernel_state(
  batch: int, heads: int, feat_dim: int, v_dim: int, dtype=jnp.float32
) -> KernelState:
  """The empty state (no keys seen) for `kernel_attention_step`.

  Args:
    batch, heads: as in the attention inputs.
    feat_dim: f, the feature dimension of phi (the query/key width d for 'elu' /
      'relu' / 'identity', 1 + d + d^2 for 'taylor', 2 * num_features for RFA,
      num_features for Performer; `Mechanism.feature_dim`).
    v_dim: dv, the value head dimension.
    dtype: accumulation dtype; keep float32 (or wider) even for bf16 models.

  Memory O(batch * heads * f * dv), independent of the sequence length.
  """
  return KernelState(
    s=jnp.zeros((batch, heads, feat_dim, v_dim), dtype),
    z=jnp.zeros((batch, heads, feat_dim), dtype),
    log_scale=jnp.full((batch, heads), masking.big_neg(dtype), dtype),
  )


def state_of_sums(s: jnp.ndarray, z: jnp.ndarray) -> KernelState:
  """The `KernelState` holding the sums S `[batch, heads, f, dv]` and Z `[batch, heads,
  f]`, its log_scale left at "empty" (the parallel forms' final state)."""
  return KernelState(s, z, jnp.full(z.shape[:2], masking.big_neg(z.dtype), z.dtype))


def _one_token(x: jnp.ndarray):
  """`[batch, heads, dim]` or `[batch, 1, heads, dim]` -> (`[batch, heads, dim]`, whether
  the input had the length axis)."""
  if x.ndim == 4:
    if x.shape[1] != 1:
      raise ValueError(f'a decoding step takes one token, got shape {x.shape}')
    return x[:, 0], True
  if x.ndim != 3:
    raise ValueError(
      f'token must be [batch, heads, dim] or [batch, 1, heads, dim], got shape {x.shape}'
    )
  return x, False


def kernel_attention_step(
  state: KernelState,
  features_t: KernelFeatures,
  v_t: jnp.ndarray,
  *,
  eps: float = 1e-6,
  normalize: bool = True,
  gate_t: Optional[jnp.ndarray] = None,
  key_valid: Optional[jnp.ndarray] = None,
):
  """One causal decoding step: add token t's key/value to the state, then read it.

      S_t = S_{t-1} + phi_k_t v_t^T          (gated: g S_{t-1} + (1 - g) phi_k_t v_t^T)
      Z_t = Z_{t-1} + phi_k_t                (gated: g Z_{t-1} + (1 - g) phi_k_t)
      out_t = phi_q_t^T S_t / safe(phi_q_t . Z_t)     (or phi_q_t^T S_t)

  Feeding tokens 0..n-1 in order reproduces the causal chunked form
  (`causal_kernel_attention`). Time and memory O(f dv) per (batch, head), independent of t.

  Grouped-query attention: the state, phi_k_t and v_t may have kv_heads heads, a
  divisor of phi_q_t's; query head i reads state i // (heads / kv_heads).

  Args:
    state: `KernelState` from `init_kernel_state` (or a prefill's final state).
    features_t: `KernelFeatures` of this token: phi_q_t `[batch, heads, f]` (or `[batch,
      1, heads, f]`, see Returns), phi_k_t `[batch, heads, f]` (or `[batch, 1, heads,
      f]`), and optional numerator features shaped like them.
    v_t: `[batch, heads, dv]` (or `[batch, 1, heads, dv]`).
    eps: denominator clamp, see `safe_denominator`.
    normalize: divide by phi_q_t . Z_t (False: plain phi_q_t^T S_t).
    gate_t: optional `[batch, heads]` (or `[batch, 1, heads]`) gate in (0, 1).
    key_valid: optional bool `[batch]`: False leaves that row's state untouched
      (a padded / finished sequence); the output still reads the state.

  Returns:
    (new_state, out_t): out_t is `[batch, heads, dv]`, or `[batch, 1, heads, dv]`
    if phi_q_t had that layout, in v_t's dtype.
  """
  phi_q_t, keep_axis = _one_token(features_t.phi_q)
  phi_k_t, _ = _one_token(features_t.phi_k)
  v_t, _ = _one_token(v_t)
  nq = phi_q_t if features_t.num_q is None else _one_token(features_t.num_q)[0]
  nk = phi_k_t if features_t.num_k is None else _one_token(features_t.num_k)[0]
  compute = jnp.promote_types(state.s.dtype, compute_dtype(phi_q_t, phi_k_t, v_t, nq, nk))
  q, k, vv, nq, nk = (x.astype(compute) for x in (phi_q_t, phi_k_t, v_t, nq, nk))
  s, z = state.s.astype(compute), state.z.astype(compute)
  if key_valid is not None:
    valid = jnp.asarray(key_valid, bool)[:, None, None]
    k = jnp.where(valid, k, 0.0)
    nk = jnp.where(valid, nk, 0.0)
    vv = jnp.where(valid, vv, 0.0)
  kv = nk[..., :, None] * vv[..., None, :]  # [b, h, f, dv]
  if gate_t is None:
    s, z = s + kv, z + k
  else:
    g = gate_t[:, 0] if gate_t.ndim == 3 else gate_t
    g = g.astype(compute)
    if key_valid is not None:
      g = jnp.where(valid[..., 0], g, 1.0)
    s = g[..., None, None] * s + (1.0 - g)[..., None, None] * kv
    z = g[..., None] * z + (1.0 - g)[..., None] * k
  groups = lambda x: x.reshape(x.shape[0], s.shape[1], -1, x.shape[-1])  # [b, kv_h, g, f]
  out = jnp.einsum('bngf,bnfd->bngd', groups(nq), s).reshape(vv.shape[0], -1, s.shape[-1])
  if normalize:
    den = jnp.einsum('bngf,bnf->bng', groups(q), z).reshape(out.shape[:2])
    out = normalize_by(out, den, eps)
  out = out.astype(v_t.dtype)
  if keep_axis:
    out = out[:, None]
  new_state = state._replace(s=s.astype(state.s.dtype), z=z.astype(state.z.dtype))
  return new_state, out

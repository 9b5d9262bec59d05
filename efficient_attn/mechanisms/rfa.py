"""Random feature attention, RFA (Peng et al. 2021): trigonometric random features.

RFA replaces exp(q^ . k^ / sigma^2) of l2-normalised queries and keys by phi(q) . phi(k)
with sin/cos random features phi and runs the shared kernel core
`efficient_attn.ops.linear_attention`, so it costs O(n D dv) time and O(n (D + dv) + D dv)
memory per head for D projections (causal: chunked scan), and decodes in O(D dv) per
token. Its declaration, with Performer's, is in `efficient_attn.mechanisms.random_features`.

Shapes: q `[batch, q_length, heads, d]`, k `[batch, kv_length, heads, d]`,
v `[batch, kv_length, heads, dv]` -> `[batch, q_length, heads, dv]`; the random
projection W `[D, d]` is shared by all heads. Masks follow
`efficient_attn.ops.masking`; only their key-padding part is honoured.
"""

from typing import Optional, Union

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import feature_maps
from efficient_attn.ops import masking
from efficient_attn.ops import rotary
from efficient_attn.ops.linear_attention import KernelState
from efficient_attn.ops.linear_attention import kernel_attention
from efficient_attn.ops.linear_attention import kernel_attention_step
from efficient_attn.ops.linear_attention import rotary_features
from efficient_attn.ops.linear_attention import zero_padding

Sigma = Union[float, jnp.ndarray]


def rfa_features(x: jnp.ndarray, projection: jnp.ndarray, sigma: Sigma = 1.0) -> jnp.ndarray:
  """RFA features of x: trig_features(x / (|x| sigma), W).

  x is l2-normalised along its last axis, then divided by sigma (a float, or an
  array broadcastable to x's leading axes, e.g. one per head `[heads]`), so
  phi(q) . phi(k) estimates exp(-|q^ - k^|^2 / (2 sigma^2)) =
  exp((q^ . k^ - 1) / sigma^2), proportional to exp(q^ . k^ / sigma^2).

  Args:
    x: `[..., heads, d]` (or any `[..., d]` with scalar sigma).
    projection: W `[D, d]`.
    sigma: kernel width.

  Returns:
    `[..., 2 D]` in float32 (or wider).
  """
  x = jnp.asarray(x)
  compute = jnp.promote_types(x.dtype, jnp.float32)
  x = x.astype(compute)
  x = x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-12)
  sigma = jnp.asarray(sigma, compute)
  x = x / sigma[..., None]
  return feature_maps.trig_features(x, projection)


def rfa_attention(
  q: jnp.ndarray,
  k: jnp.ndarray,
  v: jnp.ndarray,
  projection: jnp.ndarray,
  mask=None,
  causal: bool = False,
  eps: float = 1e-6,
  gate: Optional[jnp.ndarray] = None,
  sigma: Sigma = 1.0,
  chunk_size: Optional[int] = None,
  return_state: bool = False,
  positions=None,
  sequence_axis: Optional[str] = None,
  segment_ids=None,
):
  """Random feature attention (Peng et al. 2021).

      out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / safe(phi(q_i) . sum_j phi(k_j))

  with phi = `rfa_features` (l2-normalised inputs, width sigma, sin/cos
  features). It approximates softmax attention over the cosine similarities
  q^ . k^ / sigma^2. The trig features are sign-indefinite, so the estimated
  denominator may be ~0 or negative: it is clamped to `|den| >= eps` keeping its
  sign (`efficient_attn.ops.linear_attention.safe_denominator`), which keeps outputs and
  gradients finite.

  Recency gate (causal only, RFA-Gate): with g_t in (0, 1) per token and head,
  S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T and Z_t likewise, so older
  tokens are discounted geometrically; computed chunk-wise (see
  `efficient_attn.ops.linear_attention.chunk`).

  Time O(n D dv), memory O(n (D + dv) + D dv) per head.

  Args:
    q, k, v: see module docstring.
    projection: W `[D, d]` (e.g. `feature_maps.gaussian_projection`).
    mask: any `efficient_attn.ops.masking` form, reduced to key padding.
    causal: query i sees keys j <= i (needs q_length == kv_length).
    eps: denominator clamp.
    gate: optional `[batch, kv_length, heads]` in (0, 1); requires causal.
    sigma: kernel width, a float or per-head `[heads]`.
    chunk_size: causal chunk length (None: 64 on CPU, 256 on GPU and TPU).
    return_state: also return the final `KernelState` (prefill for decoding).
    positions: optional rotary (query, key) positions (see `linear_attention`).
    sequence_axis: one device's block of a sequence split over this mesh axis (see
      `efficient_attn.ops.linear_attention.sharded`).
    segment_ids: optional int `[batch, length]`, packed rows (0: padding): each query
      sees only the keys of its document (`ops.linear_attention.documents`).
  """
  k, v, kp = masking.checked_keys_values(q, k, v, mask, name='RFA attention', causal=causal)
  q, k, v = zero_padding(segment_ids, q, k, v)  # packed rows: 0 at the padding
  phi_q = rfa_features(q, projection, sigma)
  phi_k = rfa_features(k, projection, sigma)
  out, state = kernel_attention(
    rotary_features(phi_q, phi_k, positions),
    v,
    key_padding=kp,
    causal=causal,
    gate=gate,
    eps=eps,
    normalize=True,
    chunk_size=chunk_size,
    sequence_axis=sequence_axis,
    segment_ids=segment_ids,
  )
  return (out, state) if return_state else out


def rfa_attention_step(
  state: KernelState,
  q_t: jnp.ndarray,
  k_t: jnp.ndarray,
  v_t: jnp.ndarray,
  projection: jnp.ndarray,
  sigma: Sigma = 1.0,
  eps: float = 1e-6,
  gate_t: Optional[jnp.ndarray] = None,
  key_valid: Optional[jnp.ndarray] = None,
  position=None,
):
  """One decoding step of causal `rfa_attention` (optionally gated).

  Tokens `[batch, heads, d]` (or `[batch, 1, heads, d]`), gate_t `[batch, heads]`
  (or `[batch, 1, heads]`); the state comes from
  `init_kernel_state(batch, heads, 2 * D, dv)`. Returns (new_state, out_t), see
  `efficient_attn.ops.linear_attention.kernel_attention_step`. O(D dv) per (batch, head)
  and token.
  """
  phi_q, phi_k = rfa_features(q_t, projection, sigma), rfa_features(k_t, projection, sigma)
  return kernel_attention_step(
    state,
    rotary_features(phi_q, phi_k, rotary.at(position)),
    v_t,
    eps=eps,
    normalize=True,
    gate_t=gate_t,
    key_valid=key_valid,
  )

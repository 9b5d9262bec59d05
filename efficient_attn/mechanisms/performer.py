"""Performer, FAVOR+ (Choromanski et al. 2021): positive orthogonal random features.

Performer replaces exp(q . k / sqrt(d)) by phi(q) . phi(k) with positive random features
phi and runs the shared kernel core `efficient_attn.ops.linear_attention`, so it costs
O(n m dv) time and O(n (m + dv) + m dv) memory per head for m features (causal: chunked
scan), and decodes in O(m dv) per token. Its declaration, with RFA's, is in
`efficient_attn.mechanisms.random_features`.

Shapes: q `[batch, q_length, heads, d]`, k `[batch, kv_length, heads, d]`,
v `[batch, kv_length, heads, dv]` -> `[batch, q_length, heads, dv]`; the random
projection W `[m, d]` is shared by all heads. Masks follow
`efficient_attn.ops.masking`; only their key-padding part is honoured.
"""

import math
from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import feature_maps
from efficient_attn.ops import masking
from efficient_attn.ops import rotary
from efficient_attn.ops import segments
from efficient_attn.ops.linear_attention import KernelState
from efficient_attn.ops.linear_attention import heads_as_batch
from efficient_attn.ops.linear_attention import kernel_attention
from efficient_attn.ops.linear_attention import kernel_attention_step
from efficient_attn.ops.linear_attention import platform_loops_rows
from efficient_attn.ops.linear_attention import rotary_features
from efficient_attn.ops.linear_attention import zero_padding


def performer_eps(dtype) -> float:
  """Performer's default denominator clamp for a compute dtype: tiny^(1/4).

  About 3e-10 in float32 (1e-77 in float64). Stabilised FAVOR+ denominators are
  measured relative to the largest key feature of the whole sequence, so they
  legitimately span many orders of magnitude (a query whose visible keys are all
  much smaller than that key has a tiny one), and a clamp like 1e-6 would
  distort such rows. With positive features the output is a convex combination
  of the values whatever the clamp, so the clamp only has to rule out 0/0
  (complete underflow: output 0) and keep gradients, which scale like
  max|v| / eps, and eps^2 (formed by XLA's rewrite of a / b / c) in range.
  """
  return float(jnp.finfo(jnp.promote_types(dtype, jnp.float32)).tiny) ** 0.25


def _scaled_queries_keys(q, k):
  """q and k times d^-1/4 (so that q . k is scaled by 1 / sqrt(d)), in float32 or wider."""
  d = q.shape[-1]
  compute = jnp.promote_types(jnp.result_type(q, k), jnp.float32)
  scale = d**-0.25
  return q.astype(compute) * scale, k.astype(compute) * scale


def performer_attention(
  q: jnp.ndarray,
  k: jnp.ndarray,
  v: jnp.ndarray,
  projection: jnp.ndarray,
  mask=None,
  causal: bool = False,
  eps: Optional[float] = None,
  chunk_size: Optional[int] = None,
  return_state: bool = False,
  positions=None,
  sequence_axis: Optional[str] = None,
  segment_ids=None,
):
  """Performer FAVOR+ attention (Choromanski et al. 2021).

  q and k are scaled by d^-1/4, so phi(q) . phi(k) with the positive features
  `feature_maps.positive_features` is an unbiased estimate of exp(q . k / sqrt(d))
  (up to the stabilisers, which cancel in the ratio), and the output estimates
  softmax(q k^T / sqrt(d)) v, increasingly well as num_features grows. The
  features are positive, so the denominator is >= 0; it is clamped to >= eps,
  by default the tiny `performer_eps(dtype)` (see there).

  The key stabiliser is one max per (batch, head) over all unpadded keys (under
  stop_gradient). In the causal form it therefore also looks at later keys, but
  it cancels exactly between numerator and denominator unless a denominator
  falls below eps (then the eps clamp, and only it, depends on later keys);
  gradients w.r.t. later positions are exactly zero.

  Time O(n m dv), memory O(n (m + dv) + m dv) per head.

  Args:
    q, k, v: see module docstring.
    projection: W `[m, d]`, e.g. `feature_maps.gaussian_projection(rng, m, d)`.
    mask: any `efficient_attn.ops.masking` form, reduced to key padding.
    causal: query i sees keys j <= i (needs q_length == kv_length).
    eps: denominator clamp (None: `performer_eps` of the compute dtype).
    chunk_size: causal chunk length (None: 64 on CPU, 256 on GPU and TPU).
    return_state: also return the final `KernelState`, whose log_scale is the
      key stabiliser (prefill for `performer_attention_step`).
    positions: optional rotary (query, key) positions (see `linear_attention`).
    sequence_axis: one device's block of a sequence split over this mesh axis (see
      `efficient_attn.ops.linear_attention.sharded`); the key stabiliser is
      then the maximum over every device's keys (`lax.pmax`), so the features are the
      unsplit sequence's.
    segment_ids: optional int `[batch, length]`, packed rows (0: padding): each query
      sees only the keys of its document (`ops.linear_attention.documents`); the key
      stabiliser is then one per document (`_document_stabilizer`).
  """
  k, v, kp = masking.checked_keys_values(q, k, v, mask, name='Performer attention', causal=causal)
  q, k, v = zero_padding(segment_ids, q, k, v)  # packed rows: 0 at the padding
  if segment_ids is not None and sequence_axis is not None:
    raise ValueError(
      f'Performer attention takes segment_ids on one device only (its key stabiliser is '
      f'one per document), not split over sequence_axis={sequence_axis!r}; valid: '
      f'segment_ids=None, or sequence_axis=None'
    )
  if segment_ids is not None:  # padding (id 0) takes no part in the key stabiliser
    real = jnp.asarray(segment_ids) != 0
    kp = real if kp is None else jnp.asarray(kp, bool) & real
  loop_rows = platform_loops_rows() and q.shape[0] * q.shape[2] > 1 and sequence_axis is None
  if (q.shape[2] > 1 and sequence_axis is None) or loop_rows:  # rows one at a time on CPU
    return heads_as_batch(
      performer_attention,
      q,
      k,
      v,
      kp,
      return_state,
      loop_rows=loop_rows,
      projection=projection,
      causal=causal,
      eps=eps,
      chunk_size=chunk_size,
      positions=positions,
      segment_ids=segment_ids,
    )
  qs, ks = _scaled_queries_keys(q, k)
  eps = performer_eps(qs.dtype) if eps is None else eps
  phi_q = feature_maps.positive_features(qs, projection, is_query=True)
  stabilizer = None  # one per (batch, head), over its keys
  if sequence_axis is not None:
    stabilizer = _key_stabilizer(ks, projection, kp, sequence_axis)
  elif segment_ids is not None:
    stabilizer = _document_stabilizer(ks, projection, kp, segment_ids)
  phi_k, stab = feature_maps.positive_features(
    ks, projection, is_query=False, key_padding=kp, return_stabilizer=True, stabilizer=stabilizer
  )
  out, state = kernel_attention(
    rotary_features(phi_q, phi_k, positions),
    v,
    key_padding=kp,
    causal=causal,
    eps=eps,
    normalize=True,
    chunk_size=chunk_size,
    sequence_axis=sequence_axis,
    segment_ids=segment_ids,
  )
  if not return_state:
    return out
  log_scale = stab[:, -1, :, 0].astype(state.s.dtype)  # packed rows: the last document's
  if kp is not None:
    log_scale = jnp.where(jnp.any(kp, axis=1)[:, None], log_scale, masking.big_neg(state.s.dtype))
  return out, state._replace(log_scale=log_scale)


def _key_stabilizer(ks, projection, key_padding, axis: str):
  """`feature_maps.positive_features`' key stabiliser `[b, 1, h, 1]` over the keys of every
  device on mesh axis `axis` (0 where all are padded), under stop_gradient."""
  a = feature_maps.positive_log_features(ks, projection)
  if key_padding is not None:
    a = jnp.where(key_padding[:, :, None, None], a, -jnp.inf)
  stab = lax.pmax(lax.stop_gradient(jnp.max(a, axis=(1, 3), keepdims=True)), axis)
  return jnp.where(jnp.isfinite(stab), stab, 0.0)


def _document_stabilizer(ks, projection, key_padding, segment_ids):
  """The key stabiliser `[b, n, h, 1]` of packed rows: each key's is the maximum over its
  document's real keys (0 where it has none), under stop_gradient. One maximum over the
  row would let a document of large keys underflow another's features to 0."""
  a = jnp.max(feature_maps.positive_log_features(ks, projection), axis=-1)  # [b, n, h]
  if key_padding is not None:
    a = jnp.where(key_padding[..., None], a, -jnp.inf)
  b, n = ks.shape[:2]
  docs = jnp.arange(b)[:, None] * n + segments.document_index(segment_ids)  # [b, n]
  per_document = jax.ops.segment_max(a.reshape(b * n, -1), docs.reshape(-1), num_segments=b * n)
  stab = per_document[docs.reshape(-1)].reshape(a.shape)[..., None]
  return lax.stop_gradient(jnp.where(jnp.isfinite(stab), stab, 0.0))


def performer_attention_step(
  state: KernelState,
  q_t: jnp.ndarray,
  k_t: jnp.ndarray,
  v_t: jnp.ndarray,
  projection: jnp.ndarray,
  eps: Optional[float] = None,
  key_valid: Optional[jnp.ndarray] = None,
  position=None,
):
  """One decoding step of causal `performer_attention`.

  A recurrent form cannot use the max over all keys, so the key stabiliser is a
  running max kept in `state.log_scale`: when a new key raises it from m to m',
  S and Z are rescaled by exp(m - m') (the online-softmax trick). The ratio is
  invariant to that common scale, so the outputs equal the parallel form's
  wherever no denominator is clamped by eps.

  Tokens `[batch, heads, d]` (or `[batch, 1, heads, d]`); the state comes from
  `init_kernel_state(batch, heads, m, dv)` or a `performer_attention(...,
  causal=True, return_state=True)` prefill. Returns (new_state, out_t).
  O(m dv) per (batch, head) and token.
  """
  q_token, keep_axis = (q_t[:, 0], True) if q_t.ndim == 4 else (q_t, False)
  k_token = k_t[:, 0] if k_t.ndim == 4 else k_t
  # The layer's position is [batch, 1] (the token's position in each row's document).
  if position is not None and jnp.ndim(position) == 2:
    position = position[:, 0]
  qs, ks = _scaled_queries_keys(q_token, k_token)
  eps = performer_eps(jnp.promote_types(qs.dtype, state.s.dtype)) if eps is None else eps
  phi_q = feature_maps.positive_features(qs, projection, is_query=True)
  a = feature_maps.positive_log_features(ks, projection)  # [b, h, m]
  compute = jnp.promote_types(a.dtype, state.s.dtype)
  a = a.astype(compute)
  neg = masking.big_neg(compute)
  if key_valid is not None:
    a = jnp.where(jnp.asarray(key_valid, bool)[:, None, None], a, -jnp.inf)
  old = state.log_scale.astype(compute)
  new = lax.stop_gradient(jnp.maximum(old, jnp.max(a, axis=-1)))  # [b, h]
  new = jnp.maximum(new, neg)
  ratio = jnp.exp(old - new)
  phi_k = jnp.exp(a - new[..., None]) * (1.0 / math.sqrt(projection.shape[0]))
  rescaled = state._replace(
    s=state.s * ratio[..., None, None].astype(state.s.dtype),
    z=state.z * ratio[..., None].astype(state.z.dtype),
    log_scale=new.astype(state.log_scale.dtype),
  )
  new_state, out = kernel_attention_step(
    rescaled,
    rotary_features(phi_q, phi_k, rotary.at(position)),
    v_t,
    eps=eps,
    normalize=True,
    key_valid=key_valid,
  )
  if keep_axis and out.ndim == 3:
    out = out[:, None]
  return new_state, out

"""The causal form of kernel attention, a chunked scan: query i sees keys j <= i.

The sequence is cut into chunks of `chunk_size` c and `lax.scan`ned, carrying (S, Z).
Inside a chunk the causal part is a masked c x c quadratic term, the past arrives
through the carried state. Time O(n (c + f) dv + n c f) per head; memory
O(n (f + dv) + c^2 + f dv): no O(n f dv) cumulative-sum tensor is formed. The chunk
body is rematerialised (`jax.checkpoint`), so the backward pass stores only the inputs
and one (S, Z) per chunk, O(n (f + dv) + (n / c) f dv), i.e. O(n d) for c ~ f. Any
chunk size works; the last chunk is zero-padded.

Gated (RFA's recency gate): with g_t in (0, 1) per token and head, S_t = g_t S_{t-1} +
(1 - g_t) phi_k_t v_t^T and Z_t likewise. Inside a chunk the decays prod g are exp of
differences of cumulative log-gates, masked before exponentiation, so they never
overflow.
"""

from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.linear_attention import common
from efficient_attn.ops.linear_attention.common import KernelFeatures
from efficient_attn.ops.linear_attention.recurrent import state_of_sums

CAUSAL_CHUNK = {'cpu': 64, 'gpu': 256, 'tpu': 256}


def causal_chunk_size(chunk_size: Optional[int] = None) -> int:
  """`chunk_size`, or if None the platform's: 64 on CPU, 256 on GPU and TPU.

  Measured forward + backward at 1K-16K tokens: on one CPU core 64 beat 32,
  128 and 256 (256 costs 1.8x); on an H100 (bfloat16) 256 beat 16-128 (64
  costs 1.7x). The TPU value follows the GPU's and is not measured.
  """
  if chunk_size is not None:
    return chunk_size
  return CAUSAL_CHUNK.get(jax.default_backend(), 64)


def chunked_scan(
  features: KernelFeatures,
  v: jnp.ndarray,
  log_g: Optional[jnp.ndarray],
  *,
  eps: float,
  normalize: bool,
  chunk_size: Optional[int],
  initial=None,
):
  """The chunked causal scan on prepared inputs (`common.prepare`: compute dtype, keys
  masked and gated).

  Args:
    features: `KernelFeatures` of `[batch, n, heads, f]` arrays; the denominator uses
      phi_q, phi_k, the numerator num_q, num_k when given.
    v: `[batch, n, heads, dv]`.
    log_g: optional log decay `[batch, n, heads]` of a gate.
    eps, normalize: as in `causal_kernel_attention`.
    chunk_size: c (None: `causal_chunk_size()`).
    initial: the initial (S `[batch, heads, f, dv]`, Z `[batch, heads, f]`) (None: zeros).

  Returns:
    (out `[batch, n, heads, dv]`, the final (S, Z)).
  """
  numerator = features.numerator() if features.has_numerator else None
  phi_q, phi_k = features.phi_q, features.phi_k
  b, n, h, f = phi_q.shape
  dv = v.shape[-1]
  c = max(1, min(int(causal_chunk_size(chunk_size)), n))
  nc = -(-n // c)
  pad = nc * c - n

  def chunks(x):
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((b, nc, c) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0)  # [nc, b, c, ...]

  xs = (
    chunks(phi_q),
    chunks(phi_k),
    chunks(v),
    None if log_g is None else chunks(log_g),
    None if numerator is None else tuple(chunks(x) for x in numerator),
  )
  tri = jnp.tril(jnp.ones((c, c), bool))  # [q, k]: k <= q

  def body(carry, x):
    s, z = carry  # [b,h,f,dv], [b,h,f]
    pq, pk, vc, lg, nums = x
    nq, nk = (pq, pk) if nums is None else nums
    a_den = jnp.einsum('bqhf,bkhf->bhqk', pq, pk)
    a = a_den if nums is None else jnp.einsum('bqhf,bkhf->bhqk', nq, nk)
    if lg is None:
      a = jnp.where(tri, a, 0.0)
      a_den = a if nums is None else jnp.where(tri, a_den, 0.0)
      inter_s = jnp.einsum('bqhf,bhfd->bqhd', nq, s)
      inter_z = jnp.einsum('bqhf,bhf->bqh', pq, z)
      pk_state, nk_state = pk, nk
      s_decay = None
    else:
      cum = jnp.cumsum(lg, axis=1)  # [b, c, h], log prod_{s<=t} g_s
      cum_t = jnp.swapaxes(cum, 1, 2)  # [b, h, c]
      diff = cum_t[..., :, None] - cum_t[..., None, :]  # log prod_{j<s<=t} g_s
      decay = jnp.where(tri, jnp.exp(jnp.where(tri, diff, 0.0)), 0.0)
      a = a * decay
      a_den = a if nums is None else a_den * decay
      q_decay = jnp.exp(cum)[..., None]  # [b, c, h, 1]
      inter_s = jnp.einsum('bqhf,bhfd->bqhd', nq, s) * q_decay
      inter_z = jnp.einsum('bqhf,bhf->bqh', pq, z) * q_decay[..., 0]
      last = cum[:, -1:]  # [b, 1, h]
      pk_state = pk * jnp.exp(last - cum)[..., None]
      nk_state = pk_state if nums is None else nk * jnp.exp(last - cum)[..., None]
      s_decay = jnp.exp(last[:, 0])  # [b, h]
    num = jnp.einsum('bhqk,bkhd->bqhd', a, vc) + inter_s
    if normalize:
      den = jnp.swapaxes(jnp.sum(a_den, axis=-1), 1, 2) + inter_z  # [b, c, h]
      out = common.normalize_by(num, den, eps)
    else:
      out = num
    if s_decay is not None:
      s = s * s_decay[..., None, None]
      z = z * s_decay[..., None]
    s = s + jnp.einsum('bkhf,bkhd->bhfd', nk_state, vc)
    z = z + jnp.sum(pk_state, axis=1)
    return (s, z), out

  init = (jnp.zeros((b, h, f, dv), phi_q.dtype), jnp.zeros((b, h, f), phi_q.dtype))
  if initial is not None:
    init = tuple(x.astype(phi_q.dtype) for x in initial)
  (s, z), out = lax.scan(jax.checkpoint(body, prevent_cse=False), init, xs)
  out = jnp.moveaxis(out, 0, 1).reshape(b, nc * c, h, dv)[:, :n]
  return out, (s, z)


def check_lengths(features: KernelFeatures) -> None:
  """The causal form needs as many queries as keys."""
  lq, lk = features.phi_q.shape[1], features.phi_k.shape[1]
  if lq != lk:
    raise ValueError(
      f'causal kernel attention needs q_length == kv_length, got '
      f'{lq} and {lk}; decode with kernel_attention_step'
    )


def causal_kernel_attention(
  features: KernelFeatures,
  v: jnp.ndarray,
  key_padding: Optional[jnp.ndarray] = None,
  gate: Optional[jnp.ndarray] = None,
  *,
  eps: float = 1e-6,
  normalize: bool = True,
  chunk_size: Optional[int] = None,
):
  """Causal kernel attention: out_i = num_q_i^T S_i / safe(phi_q_i . Z_i) over keys j <= i.

  Args:
    features: `KernelFeatures`: phi_q, phi_k `[batch, length, heads, f]` (and optional
      numerator features shaped like them).
    v: `[batch, length, heads, dv]`.
    key_padding: optional bool `[batch, length]`, True = real key. Padded keys contribute
      nothing (and do not decay the state).
    gate: optional `[batch, length, heads]` recency gate in (0, 1).
    eps: denominator clamp, see `safe_denominator`.
    normalize: divide by phi_q . Z (False: plain num_q^T S, no denominator).
    chunk_size: chunk length c (None: `causal_chunk_size()`, per platform).

  Returns:
    (`[batch, length, heads, dv]` in v's dtype, the `KernelState` after the last key in
    float32 or wider: the prefill for recurrent decoding, its log_scale left at "empty").
  """
  features, values, log_g = common.prepare(features, v, key_padding, gate)
  check_lengths(features)
  out, (s, z) = chunked_scan(
    features, values, log_g, eps=eps, normalize=normalize, chunk_size=chunk_size
  )
  return out.astype(v.dtype), state_of_sums(s, z)

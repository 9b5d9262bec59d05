"""Exact scaled dot-product attention: the plain form and a memory-efficient form.

Both take q `[batch, q_length, heads, head_dim]`, k `[batch, kv_length, heads,
head_dim]`, v `[batch, kv_length, heads, v_dim]` and return `[batch, q_length,
heads, v_dim]`. Masks follow `efficient_attn.masking`.
"""
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from efficient_attn import masking
from efficient_attn.mechanisms.base import Mechanism


def _scale(head_dim: int, scale: Optional[float]) -> float:
  return 1.0 / math.sqrt(head_dim) if scale is None else scale


def softmax_attention(q, k, v, mask=None, causal: bool = False,
                      scale: Optional[float] = None, dropout_rate: float = 0.0,
                      dropout_rng=None, broadcast_dropout: bool = True):
  """softmax(q k^T * scale) v, the n x n matrix formed explicitly.

  Time O(n^2 d) per head, memory O(n^2) per head. Scores and the softmax run in
  float32 (or wider) whatever the input dtype; fully masked query rows return 0.

  Args:
    q, k, v: see module docstring.
    mask: bool, broadcastable to `[batch, heads, q_length, kv_length]`, or a key
      padding mask `[batch, kv_length]`; True = attend.
    causal: restrict query i to keys j <= i (aligned at the sequence end).
    scale: score scale, default 1/sqrt(head_dim).
    dropout_rate, dropout_rng, broadcast_dropout: dropout on the attention
      weights, as in flax; off when `dropout_rng` is None.
  """
  weights = softmax_weights(q, k, mask=mask, causal=causal, scale=scale)
  if dropout_rate > 0.0 and dropout_rng is not None:
    keep = 1.0 - dropout_rate
    shape = list(weights.shape)
    if broadcast_dropout:
      shape[0] = 1
      shape[1] = 1
    keep_mask = jax.random.bernoulli(dropout_rng, keep, shape)
    weights = weights * keep_mask.astype(weights.dtype) / keep
  out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
  return out


def softmax_weights(q, k, mask=None, causal: bool = False, scale: Optional[float] = None):
  """The attention matrix `[batch, heads, q_length, kv_length]` (float32 or wider)."""
  compute = jnp.promote_types(q.dtype, jnp.float32)
  s = jnp.einsum('bqhd,bkhd->bhqk', q.astype(compute), k.astype(compute))
  s = s * _scale(q.shape[-1], scale)
  full = masking.combine_masks(mask, causal, q.shape[1], k.shape[1])
  if full is not None:
    s = jnp.where(full, s, masking.big_neg(compute))
  w = jax.nn.softmax(s, axis=-1)
  if full is not None:
    w = jnp.where(full, w, 0.0)
  return w


def chunked_softmax_attention(q, k, v, mask=None, causal: bool = False,
                              scale: Optional[float] = None, q_chunk: int = 1024,
                              k_chunk: int = 1024):
  """Exact attention by online softmax over key chunks (Rabe & Staats, 2021).

  Queries are processed `q_chunk` at a time; for each, keys and values are
  scanned `k_chunk` at a time keeping a running max, normaliser and weighted sum.
  Both levels are rematerialised in the backward pass, so memory is
  O(n d + q_chunk * k_chunk) per head in forward and backward, time O(n^2 d).
  Equal to `softmax_attention` up to float rounding.

  Args: as `softmax_attention`; `mask` may be a key padding mask `[batch,
    kv_length]` or any mask broadcastable to `[batch, heads, q_length,
    kv_length]` (only its current chunk is read).
  """
  b, lq, h, d = q.shape
  lk = k.shape[1]
  compute = jnp.promote_types(q.dtype, jnp.float32)
  cq, ck = min(q_chunk, lq), min(k_chunk, lk)
  nq, nk = -(-lq // cq), -(-lk // ck)
  pq, pk = nq * cq - lq, nk * ck - lk
  qs = jnp.pad(q, ((0, 0), (0, pq), (0, 0), (0, 0))).astype(compute) * _scale(d, scale)
  ks = jnp.pad(k, ((0, 0), (0, pk), (0, 0), (0, 0))).astype(compute)
  vs = jnp.pad(v, ((0, 0), (0, pk), (0, 0), (0, 0))).astype(compute)
  if mask is not None:
    mask = jnp.asarray(mask, bool)
    if mask.ndim == 2:
      mask = mask[:, None, None, :]
    pad = [(0, 0), (0, 0), (0, pq if mask.shape[2] > 1 else 0),
           (0, pk if mask.shape[3] > 1 else 0)]
    mask = jnp.pad(mask, pad)
  offset = lk - lq  # causal alignment as in masking.causal_mask
  neg = masking.big_neg(compute)

  def key_step(qc, q0, carry, j):
    m, l, acc = carry
    k0 = j * ck
    kc = lax.dynamic_slice_in_dim(ks, k0, ck, axis=1)
    vc = lax.dynamic_slice_in_dim(vs, k0, ck, axis=1)
    s = jnp.einsum('bqhd,bkhd->bhqk', qc, kc)
    kpos = k0 + jnp.arange(ck)
    valid = (kpos < lk)[None, None, None, :]
    if causal:
      qpos = q0 + jnp.arange(cq)
      valid = valid & (kpos[None, :] <= qpos[:, None] + offset)[None, None]
    if mask is not None:
      mc = mask
      if mc.shape[2] > 1:
        mc = lax.dynamic_slice_in_dim(mc, q0, cq, axis=2)
      if mc.shape[3] > 1:
        mc = lax.dynamic_slice_in_dim(mc, k0, ck, axis=3)
      valid = valid & mc
    s = jnp.where(valid, s, neg)
    m_new = jnp.maximum(m, s.max(axis=-1))
    p = jnp.exp(s - m_new[..., None]) * valid
    corr = jnp.exp(m - m_new)
    l = l * corr + p.sum(axis=-1)
    acc = acc * corr[..., None] + jnp.einsum('bhqk,bkhd->bhqd', p, vc)
    return (m_new, l, acc), None

  @jax.checkpoint
  def query_chunk(i):
    q0 = i * cq
    qc = lax.dynamic_slice_in_dim(qs, q0, cq, axis=1)
    init = (jnp.full((b, h, cq), neg, compute), jnp.zeros((b, h, cq), compute),
            jnp.zeros((b, h, cq, v.shape[-1]), compute))
    step = jax.checkpoint(functools.partial(key_step, qc, q0))
    (_, l, acc), _ = lax.scan(step, init, jnp.arange(nk))
    return acc / jnp.where(l == 0, 1.0, l)[..., None]

  out = lax.map(query_chunk, jnp.arange(nq))  # [nq, b, h, cq, dv]
  out = jnp.moveaxis(out, 0, 2).reshape(b, h, nq * cq, -1)[:, :, :lq]
  return jnp.swapaxes(out, 1, 2).astype(v.dtype)


class SoftmaxAttention(Mechanism):
  """Linen wrapper of `softmax_attention` (optional attention-weight dropout)."""
  dropout_rate: float = 0.0
  broadcast_dropout: bool = True
  scale: Optional[float] = None

  def __call__(self, q, k, v, mask=None, deterministic: bool = True):
    rng = None
    if self.dropout_rate > 0.0 and not deterministic:
      rng = self.make_rng('dropout')
    dtype = self.dtype or q.dtype
    return softmax_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype),
                             mask=mask, causal=self.causal, scale=self.scale,
                             dropout_rate=self.dropout_rate, dropout_rng=rng,
                             broadcast_dropout=self.broadcast_dropout)


class ChunkedSoftmaxAttention(Mechanism):
  """Linen wrapper of `chunked_softmax_attention`."""
  q_chunk: int = 1024
  k_chunk: int = 1024
  scale: Optional[float] = None

  def __call__(self, q, k, v, mask=None, deterministic: bool = True):
    del deterministic
    dtype = self.dtype or q.dtype
    return chunked_softmax_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype),
                                     mask=mask, causal=self.causal, scale=self.scale,
                                     q_chunk=self.q_chunk, k_chunk=self.k_chunk)

"""The decay recurrence chunkwise in parallel (Yang et al. 2024, section 3).

The sequence is cut into chunks of c tokens, the state is carried from chunk to chunk by
`lax.scan`, and inside a chunk the causal part is a c x c matrix: O(n c dk + n dk dv)
time per head instead of the token scan's n sequential steps. Inside a chunk every decay
factor is exp of a difference of cumulative log-decays taken in the direction that makes
it <= 1 (from a key to a later query, or to the chunk end), masked before
exponentiation: nothing overflows however strong the decay, and the chunk-local
cumulative sums never reach the sequence length.
"""

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.gated import documents
from efficient_attn.ops.gated.common import cast_einsum
from efficient_attn.ops.gated.common import compute_dtype
from efficient_attn.ops.gated.common import decay_matrix
from efficient_attn.ops.gated.common import from_chunks
from efficient_attn.ops.gated.common import heads_first
from efficient_attn.ops.gated.common import matmul_dtype
from efficient_attn.ops.gated.common import scale_rows
from efficient_attn.ops.gated.common import to_chunks
from efficient_attn.ops.gated.reference import zero_state

SUB_CHUNK = 16  # sub-chunk of a per-feature decay's intra-chunk scores


def per_feature_scores(q, k, cum, sub: int = SUB_CHUNK):
  """sum_d q_td k_sd exp(cum_td - cum_sd) for s <= t, else 0: `[..., c, c]` from q, k and
  cumulative log-decays `[..., c, dk]`, with every exp <= 1.

  Within a sub-chunk of `sub` tokens the factors are formed per feature (masked first);
  between sub-chunks j < i they split at the end e_j of sub-chunk j:
  exp(cum_t - cum_s) = exp(cum_t - cum_e) exp(cum_e - cum_s), both <= 1, so the block is
  one matrix product (Yang et al. 2024's secondary chunking). `sub` must divide c
  (else one sub-chunk of c).
  """
  c, dk = cum.shape[-2:]
  sub = sub if c % sub == 0 else c
  ns = c // sub
  dtype = matmul_dtype(q, k)  # the matmul's operands; the factors are formed in float32
  compute = compute_dtype(q, k, cum)
  split = lambda x: x.reshape(x.shape[:-2] + (ns, sub, dk))
  qs, ks, cs = split(q.astype(compute)), split(k.astype(compute)), split(cum)  # [.., ns, sub, dk]
  tri = jnp.tril(jnp.ones((sub, sub), bool))[..., None]
  diff = cs[..., :, None, :] - cs[..., None, :, :]  # [..., ns, sub, sub, dk]
  w = jnp.where(tri, jnp.exp(jnp.where(tri, diff, 0.0)), 0.0)
  diag = jnp.einsum('...td,...sd,...tsd->...ts', qs, ks, w)  # [..., ns, sub, sub]
  if ns == 1:
    return diag[..., 0, :, :]
  end = cs[..., -1, :]  # [..., ns, dk]
  later = jnp.tril(jnp.ones((ns, ns), bool), -1)[:, :, None, None]  # [i, j]: j < i
  to_end = cs[..., :, None, :, :] - end[..., None, :, None, :]  # [..., i, j, sub, dk]
  q_ij = qs[..., :, None, :, :] * jnp.where(later, jnp.exp(jnp.where(later, to_end, 0.0)), 0.0)
  k_j = ks * jnp.exp(end[..., :, None, :] - cs)  # [..., j, sub, dk]
  off = cast_einsum('...ijtd,...jsd->...itjs', q_ij, k_j, dtype)  # [..., i, sub, j, sub]
  eye = jnp.eye(ns, dtype=diag.dtype)
  full = off + jnp.einsum('...its,ij->...itjs', diag, eye)
  return full.reshape(full.shape[:-4] + (c, c))


def gated_chunked(
  q,
  k,
  v,
  g=None,
  beta=None,
  *,
  initial_state=None,
  segment_ids=None,
  chunk_size: int = 64,
  sub_chunk: int = SUB_CHUNK,
):
  """The decay recurrence chunkwise in parallel; equals `gated_scan`.

  Inside a chunk with cumulative log-decays b_t (from the chunk start):
    o_t = (q_t * exp(b_t))^T S_0 + sum_{s<=t} (q_t * exp(b_t - b_s)) . k_s v_s,
    S_c = diag(exp(b_c)) S_0 + sum_s (k_s * exp(b_c - b_s)) v_s^T.
  A per-feature decay (GLA) gets its c x c scores from `per_feature_scores` (sub-chunks
  of `sub_chunk` tokens), every factor <= 1. Where q, k, v are all bfloat16 the matmuls
  take bfloat16 operands (`matmul_dtype`), accumulated in float32; the state, decays and
  cumulative sums are float32 whatever the inputs (float64 where an input is float64).

  Packed rows (`segment_ids`, `efficient_attn.ops.gated.documents`): the scores are masked to one
  document, S_0
  reaches the tokens of the document it carries and S_c gathers the chunk's last
  document; a padding token writes nothing, decays nothing and reads 0.

  Args: as `scan_tokens`, and chunk_size c (any length works; the last chunk is padded
  with tokens that neither write nor decay). Returns (out `[b, n, h, dv]`, final S).
  """
  del beta
  b, n, h, dk = q.shape
  dv = v.shape[-1]
  compute = compute_dtype(q, k, v, g, initial_state)
  dtype = matmul_dtype(q, k, v)
  g = jnp.zeros((b, n, h, 1), compute) if g is None else g
  packed = documents.packed(segment_ids, b, n, 'gated_chunked')
  if packed is not None:
    q, k, v, g = documents.zero_padding(packed.real, q, k, v, g)
  (qc, kc, vc, gc), c = to_chunks(
    tuple(heads_first(x, t) for x, t in ((q, dtype), (k, dtype), (v, dtype), (g, compute))),
    chunk_size,
  )
  dc = None if packed is None else documents.chunk_documents(packed.documents, c)
  s0 = zero_state(b, h, dk, dv, compute) if initial_state is None else initial_state
  scalar = g.shape[-1] == 1

  def body(s, x):
    qx, kx, vx, gx, dx = x  # [b, h, c, dk|dv|dg]; dx: (documents [b, c], doc_in [b]) or None
    cum = jnp.cumsum(gx, axis=2)  # [b, h, c, dg]
    if scalar:
      a = cast_einsum('bhqd,bhkd->bhqk', qx, kx, dtype) * decay_matrix(cum[..., 0])
    else:
      a = per_feature_scores(qx, kx, cum, sub_chunk)
    last = cum[:, :, -1:]  # [b, h, 1, dg]
    q_in = scale_rows(qx.astype(compute), jnp.exp(cum))
    k_out = scale_rows(kx.astype(compute), jnp.exp(last - cum))
    a, q_in, k_out, s_end = documents.mask_chunk(dx, a, q_in, k_out, s)  # s_end: S_0 at the end
    out = cast_einsum('bhqk,bhkv->bhqv', a, vx, dtype)
    out = out + cast_einsum('bhqd,bhdv->bhqv', q_in, s, dtype)
    s = scale_rows(s_end, jnp.swapaxes(jnp.exp(last), 2, 3))
    s = s + cast_einsum('bhkd,bhkv->bhdv', k_out, vx, dtype)
    return s, out

  s0 = s0.astype(compute)
  s, out = lax.scan(jax.checkpoint(body, prevent_cse=False), s0, (qc, kc, vc, gc, dc))
  return from_chunks(out, n), s

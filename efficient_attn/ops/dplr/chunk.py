"""The diagonal-plus-low-rank (DPLR) recurrence chunkwise, in the WY form (UT transform) of
Yang et al. 2024 extended to a low-rank transition, as flash-linear-attention's
`chunk_dplr_delta_rule`.

    S_t = (diag(exp(g_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T,      o_t = S_t^T q_t.

Written as S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T + b_t u_t^T, the pseudo-values
u_t = S_{t-1}^T a_t of a chunk solve one unit lower-triangular system. With the cumulative
log-decays from the chunk start, inclusive c_t and exclusive c'_t = c_t - g_t (per key
feature), and the chunk's start state S_0:

    (I - A_ab) U = A_ak V + W S_0,   W_t = a_t * exp(c'_t),
    A_xy[t, s] = sum_d x_td y_sd exp(c'_td - c_sd)  (s < t),   for (a, b) and (a, k);
    O = (Q * exp(c)) S_0 + B_qk V + B_qb U,
    B_xy[t, s] = sum_d x_td y_sd exp(c_td - c_sd)  (s <= t),   for (q, k) and (q, b);
    S_c = diag(exp(c_c)) S_0 + (K * exp(c_c - c))^T V + (B * exp(c_c - c))^T U.

With T = (I - A_ab)^-1 (`delta.unit_lower_inverse`) every chunk is affine in its start
state, S_c = M S_0 + H and O = O_0 + Q_eff S_0 (M `[dk, dk]`, H `[dk, dv]`, O_0 `[c, dv]`,
Q_eff `[c, dk]`), all found for every chunk at once; only the scan over chunks, two matrix
products a chunk, is sequential. Every decay factor is <= 1 (masked before exp); the
per-feature c x c scores are formed within sub-chunks and split at sub-chunk ends between
them (`pair_scores`, Yang et al. 2024's secondary chunking).
"""

from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.delta.chunk import unit_lower_inverse
from efficient_attn.ops.gated import documents
from efficient_attn.ops.gated.chunk import SUB_CHUNK
from efficient_attn.ops.gated.common import cast_einsum
from efficient_attn.ops.gated.common import compute_dtype
from efficient_attn.ops.gated.common import from_chunks
from efficient_attn.ops.gated.common import heads_first
from efficient_attn.ops.gated.common import matmul_dtype
from efficient_attn.ops.gated.common import to_chunks
from efficient_attn.ops.gated.reference import zero_state


def pair_scores(x, y, cx, cy, *, strict: bool, sub: int = SUB_CHUNK):
  """sum_d x_td y_sd exp(cx_td - cy_sd) for s < t (strict) or s <= t, else 0: `[..., c, c]`
  from x, y and cumulative log-decays cx, cy `[..., c, dk]` with cx_t <= cy_s wherever s
  (<)<= t, so every factor is <= 1.

  Within a sub-chunk of `sub` tokens the factors are formed per feature, masked before exp;
  between sub-chunks j < i they split at the end e of sub-chunk j,
  exp(cx_t - cy_s) = exp(cx_t - cy_e) exp(cy_e - cy_s), both <= 1, one matrix product.
  `sub` must divide c (else one sub-chunk of c).
  """
  c, dk = cx.shape[-2:]
  sub = sub if c % sub == 0 else c
  ns = c // sub
  split = lambda z: z.reshape(z.shape[:-2] + (ns, sub, dk))
  xs, ys, cxs, cys = (split(z) for z in (x, y, cx, cy))
  tri = jnp.tril(jnp.ones((sub, sub), bool), -1 if strict else 0)[..., None]
  diff = cxs[..., :, None, :] - cys[..., None, :, :]  # [..., ns, sub, sub, dk]
  factors = jnp.where(tri, jnp.exp(jnp.where(tri, diff, 0.0)), 0.0)
  diag = jnp.einsum('...td,...sd,...tsd->...ts', xs, ys, factors)  # [..., ns, sub, sub]
  if ns == 1:
    return diag[..., 0, :, :]
  end = cys[..., -1, :]  # [..., ns, dk]
  later = jnp.tril(jnp.ones((ns, ns), bool), -1)[:, :, None, None]  # [i, j]: j < i
  to_end = cxs[..., :, None, :, :] - end[..., None, :, None, :]  # [..., i, j, sub, dk]
  x_ij = xs[..., :, None, :, :] * jnp.where(later, jnp.exp(jnp.where(later, to_end, 0.0)), 0.0)
  y_j = ys * jnp.exp(end[..., :, None, :] - cys)  # [..., j, sub, dk]
  off = jnp.einsum('...ijtd,...jsd->...itjs', x_ij, y_j)  # [..., i, sub, j, sub]
  full = off + jnp.einsum('...its,ij->...itjs', diag, jnp.eye(ns, dtype=diag.dtype))
  return full.reshape(full.shape[:-4] + (c, c))


def dplr_chunked(
  q,
  k,
  v,
  g=None,
  ab=None,
  *,
  initial_state=None,
  segment_ids=None,
  chunk_size: int = 64,
  sub_chunk: int = SUB_CHUNK,
):
  """The DPLR recurrence chunkwise in the WY form; equals `dplr_scan`.

  Time O(n c dk + n (c + dk) (dk + dv)) per head and O(n (c + dk) (dk + dv) / c) memory
  for the chunks' summaries: the c x c scores and triangular solves of all chunks at once
  (they do not depend on the carried state), then a scan of two matrix products a chunk.
  Any length works (the last chunk is padded with tokens whose transition is I). Where q,
  k, v are all bfloat16 the products with V take bfloat16 operands accumulated in float32
  (`gated.common.matmul_dtype`); the state, decays, scores, low-rank pairs and the
  triangular inverse are float32 whatever the inputs (float64 where an input is).

  Packed rows (`segment_ids`, `efficient_attn.ops.gated.documents`): every score is masked
  to one document, so the system splits into one per document; S_0 reaches the tokens of
  the document it carries (through W and Q * exp(c)) and S_c gathers the chunk's last
  document; a padding token writes nothing, decays nothing and reads 0.

  Args: as `dplr_scan` (ab `[b, n, h, 2, dk]` required; g `[b, n, h, 1 or dk]` or None).
  Returns (out `[b, n, h, dv]`, final S `[b, h, dk, dv]`).
  """
  if ab is None:
    raise ValueError('dplr_chunked: ab (the low-rank pairs, [b, n, h, 2, dk]) is required')
  b, n, h, dk = q.shape
  dv = v.shape[-1]
  compute = compute_dtype(q, k, v, g, ab, initial_state)
  dtype = matmul_dtype(q, k, v)
  packed = documents.packed(segment_ids, b, n, 'dplr_chunked')
  if packed is not None:
    q, k, v, g, ab = documents.zero_padding(packed.real, q, k, v, g, ab)
  g = jnp.zeros((b, n, h, dk), compute) if g is None else jnp.broadcast_to(g, (b, n, h, dk))
  xs = (q, k, v, g, ab[..., 0, :], ab[..., 1, :])
  xs = tuple(heads_first(x, dtype if i == 2 else compute) for i, x in enumerate(xs))
  (qc, kc, vc, gc, ac, bc), c = to_chunks(xs, chunk_size)  # [nc, b, h, c, ...]
  cum = jnp.cumsum(gc, axis=-2)
  excl = cum - gc
  last = cum[..., -1:, :]  # [nc, b, h, 1, dk]
  scores = lambda x, y, cx, strict: pair_scores(x, y, cx, cum, strict=strict, sub=sub_chunk)
  a_ab, a_ak = scores(ac, bc, excl, True), scores(ac, kc, excl, True)
  b_qk, b_qb = scores(qc, kc, cum, False), scores(qc, bc, cum, False)
  w = ac * jnp.exp(excl)  # [nc, b, h, c, dk]
  q_in = qc * jnp.exp(cum)
  k_out, b_out = kc * jnp.exp(last - cum), bc * jnp.exp(last - cum)
  keep = jnp.ones(last.shape[:3] + (1, 1), bool)  # S_0 reaches the chunk's end
  if packed is not None:
    docs, doc_in = documents.chunk_documents(packed.documents, c)  # [nc, b, c], [nc, b]
    column = lambda m: m[:, :, None, :, None]  # [nc, b, c] -> [nc, b, 1, c, 1]
    same = (docs[..., :, None] == docs[..., None, :])[:, :, None]
    enter, leave = column(docs == doc_in[..., None]), column(docs == docs[..., -1:])
    a_ab, a_ak, b_qk, b_qb = (jnp.where(same, x, 0.0) for x in (a_ab, a_ak, b_qk, b_qb))
    w, q_in = jnp.where(enter, w, 0.0), jnp.where(enter, q_in, 0.0)
    k_out, b_out = jnp.where(leave, k_out, 0.0), jnp.where(leave, b_out, 0.0)
    keep = (docs[..., -1] == doc_in)[:, :, None, None, None]
  solve = unit_lower_inverse(-a_ab)
  mm = lambda spec, x, y: cast_einsum(spec, x, y, compute)
  mv = lambda spec, x, y: cast_einsum(spec, x, y, dtype)
  own = mm('...ts,...sv->...tv', solve, mv('...ts,...sv->...tv', a_ak, vc))  # U from zero
  reads = mm('...ts,...sk->...tk', solve, w)  # U = own + reads S_0
  out_0 = mv('...ts,...sv->...tv', b_qk, vc) + mm('...ts,...sv->...tv', b_qb, own)
  q_eff = q_in + mm('...ts,...sk->...tk', b_qb, reads)
  h_own = mv('...sk,...sv->...kv', k_out, vc) + mm('...sk,...sv->...kv', b_out, own)
  diag = jnp.where(keep, jnp.exp(jnp.swapaxes(last, -1, -2)), 0.0)  # [nc, b, h, dk, 1]
  m = diag * jnp.eye(dk, dtype=compute) + mm('...sk,...sj->...kj', b_out, reads)

  def body(s, x):
    m_x, h_x, out_x, q_x = x
    out = out_x + mm('bhtk,bhkv->bhtv', q_x, s)
    return mm('bhkj,bhjv->bhkv', m_x, s) + h_x, out

  s0 = zero_state(b, h, dk, dv, compute) if initial_state is None else initial_state
  s, out = lax.scan(body, s0.astype(compute), (m, h_own, out_0, q_eff))
  return from_chunks(out, n), s

"""The (gated) delta rule chunkwise, in the WY form (UT transform) of Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length", with a decay
per head (Gated DeltaNet) or per key feature (Kimi Delta Attention, Kimi Team 2025).

Written as S_t = D_t S_{t-1} + k_t u_t^T, D_t = diag(a_t) (a_t one number a head, or one
per key feature), the pseudo-values u_t = beta_t (v_t - (D_t S_{t-1})^T k_t) of a chunk
solve one unit lower-triangular system per chunk. With cumulative log-decays b_t `[dg]`
from the chunk start (dg = 1 or dk), the chunk's start state S_0 and the decayed scores
R(X, Y)_ts = sum_d x_td y_sd exp(b_td - b_sd) (s <= t; for dg = 1 the plain scores times
the decay matrix exp(b_t - b_s), for dg = dk `gated.chunk.per_feature_scores`):

    (I + A) U = diag(beta) V - diag(beta) (K * exp(b)) S_0,   A_ts = beta_t R(K, K)_ts (s < t)
    O = (Q * exp(b)) S_0 + R(Q, K) U
    S_c = diag(exp(b_c)) S_0 + (K * exp(b_c - b))^T U

so U = T (beta V) - T (beta K exp(b)) S_0 with T = (I + A)^-1: T (`unit_lower_inverse`)
is found for every chunk at once, by forward substitution, before the scan over chunks.
Every decay factor is <= 1 (exp of a difference taken towards the later token, masked
before exp; a per-feature decay's scores by secondary chunking): none is formed as
exp(b_t) exp(-b_s), which overflows.
"""

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops.gated import documents
from efficient_attn.ops.gated.chunk import per_feature_scores
from efficient_attn.ops.gated.common import cast_einsum
from efficient_attn.ops.gated.common import compute_dtype
from efficient_attn.ops.gated.common import decay_matrix
from efficient_attn.ops.gated.common import from_chunks
from efficient_attn.ops.gated.common import heads_first
from efficient_attn.ops.gated.common import matmul_dtype
from efficient_attn.ops.gated.common import scale_rows
from efficient_attn.ops.gated.common import to_chunks
from efficient_attn.ops.gated.reference import zero_state


@jax.custom_vjp
def unit_lower_inverse(a):
  """(I + A)^-1 for strictly lower-triangular A `[..., c, c]`, by forward substitution:
  row t of T = e_t - A_t T (rows s < t final), c steps each batched over every leading axis
  (XLA's batched triangular solve is many times slower on CPU). Its gradient is
  -T^T dT T^T, kept strictly lower."""
  return _unit_lower_inverse(a)


def _unit_lower_inverse(a):
  c = a.shape[-1]
  eye = jnp.broadcast_to(jnp.eye(c, dtype=a.dtype), a.shape)

  def row(t, inv):
    new = eye[..., t, :] - jnp.einsum('...s,...sj->...j', a[..., t, :], inv)
    return inv.at[..., t, :].set(new)

  return lax.fori_loop(1, c, row, eye)


def _inverse_fwd(a):
  inv = _unit_lower_inverse(a)
  return inv, inv


def _inverse_bwd(inv, d_inv):
  t = jnp.swapaxes(inv, -1, -2)
  return (jnp.tril(-(t @ d_inv @ t), -1),)


unit_lower_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def delta_chunked(
  q, k, v, g=None, beta=None, *, initial_state=None, segment_ids=None, chunk_size: int = 64
):
  """The (gated) delta rule chunkwise in the WY form; equals `delta_scan`.

  Time O(n c (dk + dv) + n dk dv + n c^2) per head: the c x c triangular solves of
  all chunks at once (they do not depend on the state), then a scan of matrix products
  over the chunks. Any length works (the last chunk is padded with
  beta = 0 tokens, which change nothing). A decay per key feature (g `[b, n, h, dk]`,
  KDA) forms its decayed c x c scores chunk by chunk (`gated.chunk.per_feature_scores`,
  sub-chunks of 16; O(c sub dk) memory a chunk, recomputed backward), so the extra memory
  stays O(n c) a head. Where q, k, v are all bfloat16 the matmuls take
  bfloat16 operands accumulated in float32 (`gated.common.matmul_dtype`); the state,
  decays, beta and the triangular inverse are float32 whatever the inputs (float64 where
  an input is float64).

  Packed rows (`segment_ids`, `efficient_attn.ops.gated.documents`): A is masked to one
  document, so the system splits into one per document; S_0 reaches the tokens of the
  document it carries (in the system's right-hand side and the output) and S_c gathers the
  chunk's last document; a padding token writes nothing, decays nothing and reads 0.

  Args: as `gated.scan_tokens` (beta `[b, n, h]` required). Returns (out `[b, n, h, dv]`,
  final S).
  """
  b, n, h, dk = q.shape
  dv = v.shape[-1]
  gated = g is not None
  if gated and g.shape[-1] not in (1, dk):
    raise ValueError(
      f'delta_chunked: log-decays of shape {tuple(g.shape)}; valid: one per head '
      f'{[b, n, h, 1]} or one per key feature {[b, n, h, dk]}'
    )
  per_feature = gated and g.shape[-1] != 1
  compute = compute_dtype(q, k, v, g, beta, initial_state)
  dtype = matmul_dtype(q, k, v)
  matmul = lambda spec, x, y: cast_einsum(spec, x, y, dtype)
  packed = documents.packed(segment_ids, b, n, 'delta_chunked')
  if packed is not None:
    q, k, v, g, beta = documents.zero_padding(packed.real, q, k, v, g, beta)
  xs = tuple(
    None if x is None else heads_first(x, t)
    for x, t in ((q, dtype), (k, dtype), (v, dtype), (g, compute), (beta, compute))
  )
  (qc, kc, vc, gc, bc), c = to_chunks(xs, chunk_size)
  dc = None if packed is None else documents.chunk_documents(packed.documents, c)
  s0 = zero_state(b, h, dk, dv, compute) if initial_state is None else initial_state
  # The UT transform of every chunk at once (it does not depend on the carried state):
  # [T (beta V), T (beta exp(b) K)] with T = (I + A)^-1. Without a decay (DeltaNet) every
  # factor exp(.) is 1 and none is computed. Row factors are `[..., c, dg]` (dg = 1 or dk).
  causal = jnp.tril(jnp.ones((c, c), compute))
  cum = jnp.cumsum(gc, axis=3) if gated else None  # [nc, b, h, c, dg]

  def scores(x, y, cx):
    """R(X, Y) `[..., c, c]` (s <= t) under the cumulative log-decays cx `[..., c, dg]`."""
    if per_feature:  # on one leading axis: XLA on CPU crashed differentiating more in bfloat16
      flat = lambda z: z.reshape((-1,) + z.shape[-2:])
      return per_feature_scores(flat(x), flat(y), flat(cx)).reshape(x.shape[:-1] + (c,))
    xy = matmul('...td,...sd->...ts', x, y)
    return xy * (decay_matrix(cx[..., 0]) if gated else causal)

  if per_feature:  # chunk by chunk, recomputed backward: O(n c), not O(n sub dk), a head
    kk = lax.map(jax.checkpoint(lambda x: scores(x[0], x[0], x[1])), (kc, cum))
  else:
    kk = scores(kc, kc, cum)
  a = jnp.tril(scale_rows(kk, bc[..., None]), -1)
  write = bc[..., None] if cum is None else bc[..., None] * jnp.exp(cum)  # [nc, b, h, c, 1|dg]
  if dc is not None:  # one system per document; S_0 enters the carried document's rows
    chunk_docs, doc_in = dc  # [nc, b, c], [nc, b]
    a = jnp.where((chunk_docs[..., :, None] == chunk_docs[..., None, :])[:, :, None], a, 0.0)
    write = jnp.where((chunk_docs == doc_in[..., None])[:, :, None, :, None], write, 0.0)
  rhs = jnp.concatenate(
    [scale_rows(vc.astype(compute), bc[..., None]), scale_rows(kc.astype(compute), write)], -1
  )
  solved = matmul('...ts,...sd->...td', unit_lower_inverse(a), rhs)

  def body(s, x):
    qx, kx, cx, sx, dx = x  # [b, h, c, ...]; cx [b, h, c, dg]; dx: (documents, doc_in) or None
    u = sx[..., :dv] - matmul('bhtk,bhkv->bhtv', sx[..., dv:], s)
    qk = scores(qx, kx, cx)
    if gated:
      last = cx[..., -1:, :]  # [b, h, 1, dg]
      qx = scale_rows(qx.astype(compute), jnp.exp(cx))
      kx = scale_rows(kx.astype(compute), jnp.exp(last - cx))
    qk, qx, kx, s_end = documents.mask_chunk(dx, qk, qx, kx, s)  # s_end: S_0 at the end
    out = matmul('bhtk,bhkv->bhtv', qx, s) + matmul('bhts,bhsv->bhtv', qk, u)
    if gated:
      keep = jnp.broadcast_to(jnp.swapaxes(jnp.exp(last), -1, -2), s.shape[:-1] + (1,))
      s_end = scale_rows(s_end, keep)  # row i of S_0 by exp(b_c) (of feature i)
    return s_end + matmul('bhtk,bhtv->bhkv', kx, u), out

  s0 = s0.astype(compute)
  s, out = lax.scan(jax.checkpoint(body, prevent_cse=False), s0, (qc, kc, cum, solved, dc))
  return from_chunks(out, n), s

"""The (gated) delta rule chunkwise, in the WY form (UT transform) of Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length".

Written as S_t = a_t S_{t-1} + k_t u_t^T, the pseudo-values
u_t = beta_t (v_t - a_t S_{t-1}^T k_t) of a chunk solve one unit lower-triangular system
per chunk. With cumulative log-decays b_t from the chunk start, G_ts = exp(b_t - b_s)
and the chunk's start state S_0:

    (I + A) U = diag(beta) V - diag(beta exp(b)) K S_0,   A_ts = beta_t G_ts k_t.k_s (s < t)
    O = (Q * exp(b)) S_0 + ((Q K^T) * G, s <= t) U
    S_c = exp(b_c) S_0 + (K * exp(b_c - b))^T U

so U = T (beta V) - T (beta exp(b) K) S_0 with T = (I + A)^-1: T (`unit_lower_inverse`)
is found for every chunk at once, by forward substitution, before the scan over chunks.
Every decay factor is <= 1 (masked before exp).
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
  beta = 0 tokens, which change nothing). Where q, k, v are all bfloat16 the matmuls take
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
  compute = compute_dtype(q, k, v, g, beta, initial_state)
  dtype = matmul_dtype(q, k, v)
  matmul = lambda spec, x, y: cast_einsum(spec, x, y, dtype)
  packed = documents.packed(segment_ids, b, n, 'delta_chunked')
  if packed is not None:
    q, k, v, g, beta = documents.zero_padding(packed.real, q, k, v, g, beta)
  xs = tuple(
    None if x is None else heads_first(x, t)
    for x, t in (
      (q, dtype),
      (k, dtype),
      (v, dtype),
      (g[..., 0] if gated else None, compute),
      (beta, compute),
    )
  )
  (qc, kc, vc, gc, bc), c = to_chunks(xs, chunk_size)
  dc = None if packed is None else documents.chunk_documents(packed.documents, c)
  s0 = zero_state(b, h, dk, dv, compute) if initial_state is None else initial_state
  # The UT transform of every chunk at once (it does not depend on the carried state):
  # [T (beta V), T (beta exp(b) K)] with T = (I + A)^-1. Without a decay (DeltaNet) every
  # factor exp(.) is 1 and none is computed.
  causal = jnp.tril(jnp.ones((c, c), compute))
  cum = jnp.cumsum(gc, axis=-1) if gated else None  # [nc, b, h, c]
  decay = decay_matrix(cum) if gated else causal  # G_ts, s <= t
  scale_rows_by = lambda x, f: scale_rows(x, f[..., None])  # f `[..., rows]`, one factor a row
  a = jnp.tril(scale_rows_by(matmul('...td,...sd->...ts', kc, kc) * decay, bc), -1)
  write = bc * jnp.exp(cum) if cum is not None else bc
  if dc is not None:  # one system per document; S_0 enters the carried document's rows
    chunk_docs, doc_in = dc  # [nc, b, c], [nc, b]
    a = jnp.where((chunk_docs[..., :, None] == chunk_docs[..., None, :])[:, :, None], a, 0.0)
    write = jnp.where((chunk_docs == doc_in[..., None])[:, :, None], write, 0.0)
  rhs = jnp.concatenate(
    [scale_rows_by(vc.astype(compute), bc), scale_rows_by(kc.astype(compute), write)], -1
  )
  solved = matmul('...ts,...sd->...td', unit_lower_inverse(a), rhs)

  def body(s, x):
    qx, kx, cx, sx, dx = x  # [b, h, c, ...]; cx [b, h, c]; dx: (documents, doc_in) or None
    u = sx[..., :dv] - matmul('bhtk,bhkv->bhtv', sx[..., dv:], s)
    qk = matmul('bhtd,bhsd->bhts', qx, kx)
    if gated:
      last = cx[..., -1:]
      qk = qk * decay_matrix(cx)
      qx = scale_rows_by(qx.astype(compute), jnp.exp(cx))
      kx = scale_rows_by(kx.astype(compute), jnp.exp(last - cx))
    else:
      qk = qk * causal
    qk, qx, kx, s_end = documents.mask_chunk(dx, qk, qx, kx, s)  # s_end: S_0 at the end
    out = matmul('bhtk,bhkv->bhtv', qx, s) + matmul('bhts,bhsv->bhtv', qk, u)
    if gated:
      s_end = scale_rows_by(s_end, jnp.broadcast_to(jnp.exp(last), s.shape[:-1]))
    return s_end + matmul('bhtk,bhtv->bhkv', kx, u), out

  s0 = s0.astype(compute)
  s, out = lax.scan(jax.checkpoint(body, prevent_cse=False), s0, (qc, kc, cum, solved, dc))
  return from_chunks(out, n), s

"""Exact attention in O(n) memory with a hand-written backward pass (FlashAttention).

The algorithm of Dao et al. (2022) and Dao (2023), written with XLA loops
instead of a kernel: the forward pass runs the online softmax over key blocks
for each query block and keeps only the output and the log-sum-exp per query;
the backward pass (a `jax.custom_vjp`) walks the key blocks once, recomputes
each block's probabilities from the log-sum-exp, and accumulates dq, dk and dv.
That is 7 n^2 d matrix work against dense attention's 6, with no n x n array
alive at any time. With causal masking, blocks above the diagonal are skipped
in both passes.

Arrays here are already padded to whole blocks: q `[batch, q_blocks * cq,
heads, d]` (pre-scaled), k `[batch, k_blocks * ck, heads, d]`, v `[batch,
k_blocks * ck, heads, dv]`, all in the compute dtype. `mask` is None or bool
`[b|1, h|1, q|1, k]` over the padded lengths; `documents` None or a
`masking.document_pair` over them (query and key documents `[b, lq]`, `[b, lk]`);
`bias` None or a pair (query bias `[b, lq, h]`, key bias `[b, lk, h]`) in the compute
dtype, added to every score: s_ij + (a_i + c_j), the pair summed first so a large a_i
and c_j cancel before they meet s (Forgetting Attention's F_i - F_j, Lin et al. 2025;
ALiBi's causal -m (i - j)). Its gradient is the rows' and columns' sums of dS.

Packed rows (`documents`): a query sees only its own document's keys, and a pair of
blocks whose documents cannot meet in any row of the batch (the lowest document of one
above the highest of the other, `masking.document_ranges`) is skipped in both passes
(`lax.cond`). That is where packing gains: rows of many short documents cost about
n (document length + block) d instead of n^2 d. The skip is the batch's, not each row's:
walking the rows one at a time (`lax.map`) to skip per row cost more than it saved
(CPU, 2-8 rows of 2048 tokens, documents of 16-256: 15% slower packed, 40% slower on
rows of one document). `chunked_softmax_attention`
(efficient_attn.mechanisms.softmax) pads, scales and calls `attend`.
"""

import functools
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import masking
from efficient_attn.ops import online_softmax


class Blocks(NamedTuple):
  """The static layout: block sizes, true key length, causal offset (lk - lq), and whether
  block pairs that share no document are skipped (`documents`; off only to measure it)."""

  cq: int
  ck: int
  kv_length: int
  causal: bool
  offset: int
  skip: bool = True


def _valid(cfg: Blocks, mask, documents, q0, k0):
  """bool `[b|1, h|1, cq, ck]`: key in range, causal order, mask, one document."""
  kpos = k0 + jnp.arange(cfg.ck)
  valid = (kpos < cfg.kv_length)[None, None, None, :]
  if cfg.causal:
    qpos = q0 + jnp.arange(cfg.cq)
    valid = valid & (kpos[None, :] <= qpos[:, None] + cfg.offset)[None, None]
  if mask is not None:
    if mask.shape[2] > 1:
      mask = lax.dynamic_slice_in_dim(mask, q0, cfg.cq, axis=2)
    if mask.shape[3] > 1:
      mask = lax.dynamic_slice_in_dim(mask, k0, cfg.ck, axis=3)
    valid = valid & mask
  if documents is not None:
    query, key = documents
    query = lax.dynamic_slice_in_dim(query, q0, cfg.cq, axis=1)
    key = lax.dynamic_slice_in_dim(key, k0, cfg.ck, axis=1)
    valid = valid & masking.same_document((query, key))
  return valid


def _meets(cfg: Blocks, documents):
  """(i, j) -> bool: query block i and key block j may share a document in some row of
  the batch (`masking.ranges_meet` of their lowest and highest document), or None: every
  pair is computed (no documents, or `cfg.skip` off)."""
  if documents is None or not cfg.skip:
    return None
  query = masking.document_ranges(documents[0], cfg.cq)
  key = masking.document_ranges(documents[1], cfg.ck)
  at = lambda ranges, i: tuple(r[:, i] for r in ranges)
  return lambda i, j: jnp.any(masking.ranges_meet(at(query, i), at(key, j)))


def _when(meets, i, j, compute, carry):
  """compute(carry) where block pair (i, j) may share a document, else carry unchanged."""
  if meets is None:
    return compute(carry)
  return lax.cond(meets(i, j), compute, lambda carry: carry, carry)


def _key_blocks_for(cfg: Blocks, q0, num_k):
  """Key blocks [0, end) that query block q0 can see (all unless causal)."""
  if not cfg.causal:
    return num_k
  last_key = q0 + cfg.cq - 1 + cfg.offset
  return jnp.clip(last_key // cfg.ck + 1, 0, num_k)


def _query_blocks_from(cfg: Blocks, k0):
  """First query block that sees key block k0 (0 unless causal)."""
  if not cfg.causal:
    return 0
  return jnp.maximum(0, (k0 - cfg.offset) // cfg.cq)


def _block(x, start, size):
  return lax.dynamic_slice_in_dim(x, start, size, axis=1)


def _biased(cfg: Blocks, s, bias, q0, k0):
  """The block's scores s `[b, h, cq, ck]` plus its share of `bias` (None: s)."""
  if bias is None:
    return s
  query = jnp.swapaxes(_block(bias[0], q0, cfg.cq), 1, 2)  # [b, h, cq]
  key = jnp.swapaxes(_block(bias[1], k0, cfg.ck), 1, 2)
  return s + (query[..., :, None] + key[..., None, :])


def _forward(cfg: Blocks, q, k, v, mask, documents, bias=None):
  """out `[b, lq, h, dv]` and log-sum-exp `[b, h, lq]` (+inf for rows with no key)."""
  b, lq, h, _ = q.shape
  num_q, num_k = lq // cfg.cq, k.shape[1] // cfg.ck
  meets = _meets(cfg, documents)

  def query_block(i):
    q0 = i * cfg.cq
    qc = _block(q, q0, cfg.cq)

    def key_block(j, state):
      k0 = j * cfg.ck

      def update(state):
        s = jnp.einsum('bqhd,bkhd->bhqk', qc, _block(k, k0, cfg.ck))
        s = _biased(cfg, s, bias, q0, k0)
        valid = _valid(cfg, mask, documents, q0, k0)
        return online_softmax.update(state, s, valid, _block(v, k0, cfg.ck))

      return _when(meets, i, j, update, state)

    state = lax.fori_loop(
      0,
      _key_blocks_for(cfg, q0, num_k),
      key_block,
      online_softmax.init(b, h, cfg.cq, v.shape[-1], q.dtype),
    )
    lse = jnp.where(state.l > 0, state.m + jnp.log(state.l), jnp.inf)
    return jnp.swapaxes(online_softmax.finish(state), 1, 2), lse

  out, lse = lax.map(query_block, jnp.arange(num_q))  # [nq, b, cq, h, dv], [nq, b, h, cq]
  out = jnp.moveaxis(out, 0, 1).reshape(b, lq, h, -1)
  lse = jnp.moveaxis(lse, 0, 2).reshape(b, h, lq)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def attend(cfg: Blocks, q, k, v, mask, documents=None, bias=None):
  """softmax(q k^T + bias) v over the padded blocks: `[b, lq, h, dv]` (see module
  docstring)."""
  return _forward(cfg, q, k, v, mask, documents, bias)[0]


def _attend_fwd(cfg, q, k, v, mask, documents=None, bias=None):
  out, lse = _forward(cfg, q, k, v, mask, documents, bias)
  return out, (q, k, v, mask, documents, out, lse, bias)


def _attend_bwd(cfg, res, g):
  q, k, v, mask, documents, out, lse, bias = res
  g = g.astype(q.dtype)
  num_q, num_k = q.shape[1] // cfg.cq, k.shape[1] // cfg.ck
  meets = _meets(cfg, documents)
  delta = jnp.einsum('bqhd,bqhd->bhq', g, out)  # rowsum(dO * O), FlashAttention-2's D

  def key_block(j, carry):  # carry: dq (and the query bias's gradient)
    k0 = j * cfg.ck
    kc, vc = _block(k, k0, cfg.ck), _block(v, k0, cfg.ck)

    def query_block(i, carry):
      def compute(carry):
        dq, dk, dv = carry[:3]
        q0 = i * cfg.cq
        qc, gc = _block(q, q0, cfg.cq), _block(g, q0, cfg.cq)
        s = _biased(cfg, jnp.einsum('bqhd,bkhd->bhqk', qc, kc), bias, q0, k0)
        lse_c = lax.dynamic_slice_in_dim(lse, q0, cfg.cq, axis=2)[..., None]
        p = jnp.where(_valid(cfg, mask, documents, q0, k0), jnp.exp(s - lse_c), 0.0)
        dv = dv + jnp.einsum('bhqk,bqhd->bkhd', p, gc)
        dp = jnp.einsum('bqhd,bkhd->bhqk', gc, vc)
        ds = p * (dp - lax.dynamic_slice_in_dim(delta, q0, cfg.cq, axis=2)[..., None])
        dk = dk + jnp.einsum('bhqk,bqhd->bkhd', ds, qc)
        dq_c = _block(dq, q0, cfg.cq) + jnp.einsum('bhqk,bkhd->bqhd', ds, kc)
        dq = lax.dynamic_update_slice_in_dim(dq, dq_c, q0, axis=1)
        if bias is None:
          return dq, dk, dv
        dbias_q, dbias_k = carry[3:]  # [b, lq, h] and this key block's [b, ck, h]
        row = _block(dbias_q, q0, cfg.cq) + jnp.swapaxes(ds.sum(-1), 1, 2)
        dbias_q = lax.dynamic_update_slice_in_dim(dbias_q, row, q0, axis=1)
        return dq, dk, dv, dbias_q, dbias_k + jnp.swapaxes(ds.sum(-2), 1, 2)

      return _when(meets, i, j, compute, carry)

    # The loop's carry: dq, dk, dv (and the query bias's gradient, this key block's).
    init = (carry[0], jnp.zeros_like(kc), jnp.zeros_like(vc))
    if bias is not None:
      init += (carry[1], jnp.zeros(kc.shape[:3], bias[1].dtype))
    out = lax.fori_loop(_query_blocks_from(cfg, k0), num_q, query_block, init)
    rows, keys = (out[0],) + out[3:4], out[1:3] + out[4:]
    return rows, keys

  def scan_step(carry, j):
    return key_block(j, carry)

  init = (jnp.zeros_like(q),) + (() if bias is None else (jnp.zeros_like(bias[0]),))
  rows, keys = lax.scan(scan_step, init, jnp.arange(num_k))
  b, _, h, d = k.shape
  whole = lambda x: jnp.moveaxis(x, 0, 1).reshape((b, num_k * cfg.ck) + x.shape[3:])
  dq, dk, dv = rows[0], whole(keys[0]), whole(keys[1])
  dbias = None if bias is None else (rows[1], whole(keys[2]))
  return dq, dk, dv, None, None, dbias


attend.defvjp(_attend_fwd, _attend_bwd)


def forward(cfg: Blocks, q, k, v, mask, documents=None, bias=None):
  """`attend`'s forward, not differentiated: (out `[b, lq, h, dv]`, log-sum-exp `[b, h, lq]`,
  +inf for a row with no key)."""
  return _forward(cfg, q, k, v, mask, documents, bias)


def backward(cfg: Blocks, q, k, v, mask, out, lse, g, documents=None, bias=None):
  """(dq, dk, dv) of these keys' share of an attention whose output `out` and log-sum-exp
  `lse` (+inf for a row with no key) may span more keys than k (`forward`'s over a larger
  key set, or several merged), for the output cotangent g: with the whole attention's out
  and lse, each block's p = exp(s - lse) is its share of the whole softmax (ring
  attention's backward, `efficient_attn.ops.collectives.ring_attention`). With `bias`,
  (dq, dk, dv, d query bias, d key bias)."""
  grads = _attend_bwd(cfg, (q, k, v, mask, documents, out, lse, bias), g)
  return grads[:3] if bias is None else grads[:3] + tuple(grads[5])

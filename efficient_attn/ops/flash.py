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
`[b|1, h|1, q|1, k]` over the padded lengths. `chunked_softmax_attention`
(efficient_attn.mechanisms.softmax) pads, scales and calls `attend`.
"""

import functools
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import online_softmax


class Blocks(NamedTuple):
  """The static layout: block sizes, true key length, causal offset (lk - lq)."""

  cq: int
  ck: int
  kv_length: int
  causal: bool
  offset: int


def _valid(cfg: Blocks, mask, q0, k0):
  """bool `[b|1, h|1, cq, ck]`: key in range, causal order, mask (None if all valid)."""
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
  return valid


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


def _forward(cfg: Blocks, q, k, v, mask):
  """out `[b, lq, h, dv]` and log-sum-exp `[b, h, lq]` (+inf for rows with no key)."""
  b, lq, h, _ = q.shape
  num_q, num_k = lq // cfg.cq, k.shape[1] // cfg.ck

  def query_block(i):
    q0 = i * cfg.cq
    qc = _block(q, q0, cfg.cq)

    def key_block(j, state):
      k0 = j * cfg.ck
      s = jnp.einsum('bqhd,bkhd->bhqk', qc, _block(k, k0, cfg.ck))
      return online_softmax.update(state, s, _valid(cfg, mask, q0, k0), _block(v, k0, cfg.ck))

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
def attend(cfg: Blocks, q, k, v, mask):
  """softmax(q k^T) v over the padded blocks: `[b, lq, h, dv]` (see module docstring)."""
  return _forward(cfg, q, k, v, mask)[0]


def _attend_fwd(cfg, q, k, v, mask):
  out, lse = _forward(cfg, q, k, v, mask)
  return out, (q, k, v, mask, out, lse)


def _attend_bwd(cfg, res, g):
  q, k, v, mask, out, lse = res
  num_q, num_k = q.shape[1] // cfg.cq, k.shape[1] // cfg.ck
  g = g.astype(q.dtype)
  delta = jnp.einsum('bqhd,bqhd->bhq', g, out)  # rowsum(dO * O), FlashAttention-2's D

  def key_block(j, dq):
    k0 = j * cfg.ck
    kc, vc = _block(k, k0, cfg.ck), _block(v, k0, cfg.ck)

    def query_block(i, carry):
      dq, dk, dv = carry
      q0 = i * cfg.cq
      qc, gc = _block(q, q0, cfg.cq), _block(g, q0, cfg.cq)
      s = jnp.einsum('bqhd,bkhd->bhqk', qc, kc)
      lse_c = lax.dynamic_slice_in_dim(lse, q0, cfg.cq, axis=2)[..., None]
      p = jnp.where(_valid(cfg, mask, q0, k0), jnp.exp(s - lse_c), 0.0)
      dv = dv + jnp.einsum('bhqk,bqhd->bkhd', p, gc)
      dp = jnp.einsum('bqhd,bkhd->bhqk', gc, vc)
      ds = p * (dp - lax.dynamic_slice_in_dim(delta, q0, cfg.cq, axis=2)[..., None])
      dk = dk + jnp.einsum('bhqk,bqhd->bkhd', ds, qc)
      dq_c = _block(dq, q0, cfg.cq) + jnp.einsum('bhqk,bkhd->bqhd', ds, kc)
      return lax.dynamic_update_slice_in_dim(dq, dq_c, q0, axis=1), dk, dv

    dq, dk, dv = lax.fori_loop(
      _query_blocks_from(cfg, k0), num_q, query_block, (dq, jnp.zeros_like(kc), jnp.zeros_like(vc))
    )
    return dq, (dk, dv)

  def scan_step(dq, j):
    return key_block(j, dq)

  dq, (dk, dv) = lax.scan(scan_step, jnp.zeros_like(q), jnp.arange(num_k))
  b, _, h, d = k.shape
  dk = jnp.moveaxis(dk, 0, 1).reshape(b, num_k * cfg.ck, h, d)
  dv = jnp.moveaxis(dv, 0, 1).reshape(b, num_k * cfg.ck, h, -1)
  return dq, dk, dv, None


attend.defvjp(_attend_fwd, _attend_bwd)


def forward(cfg: Blocks, q, k, v, mask):
  """`attend`'s forward, not differentiated: (out `[b, lq, h, dv]`, log-sum-exp `[b, h, lq]`,
  +inf for a row with no key)."""
  return _forward(cfg, q, k, v, mask)


def backward(cfg: Blocks, q, k, v, mask, out, lse, g):
  """(dq, dk, dv) of these keys' share of an attention whose output `out` and log-sum-exp
  `lse` (+inf for a row with no key) may span more keys than k (`forward`'s over a larger
  key set, or several merged), for the output cotangent g: with the whole attention's out
  and lse, each block's p = exp(s - lse) is its share of the whole softmax (ring
  attention's backward, `efficient_attn.ops.collectives.ring_attention`)."""
  return _attend_bwd(cfg, (q, k, v, mask, out, lse), g)[:3]

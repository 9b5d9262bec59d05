"""Exact scaled dot-product attention: the plain form and a memory-efficient form.

Both take q `[batch, q_length, heads, head_dim]`, k `[batch, kv_length, heads,
head_dim]`, v `[batch, kv_length, heads, v_dim]` and return `[batch, q_length,
heads, v_dim]`. Masks follow `efficient_attn.ops.masking`. The plain form's math
(`softmax_attention`, `softmax_weights`) lives in `efficient_attn.ops.scaled_dot_product`, which
the registry imports too; it is re-exported here.
"""

from typing import Optional

import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops import collectives
from efficient_attn.ops import flash
from efficient_attn.ops import fused_softmax
from efficient_attn.ops import masking
from efficient_attn.ops import scaled_dot_product as softmax_lib
from efficient_attn.ops.scaled_dot_product import default_scale
from efficient_attn.ops.scaled_dot_product import softmax_attention
from efficient_attn.ops.scaled_dot_product import softmax_weights  # noqa: F401  (re-exported)

SCALE = registry.Option(
  'scale', None, float, 'score scale; None: 1/sqrt(head_dim)', above=0.0, allow_none=True
)
IMPLEMENTATION = registry.Option(
  'implementation',
  'auto',
  str,
  "'auto': the platform's fused kernel (GPU: cuDNN for "
  "16-bit, else the Pallas flash kernel; TPU: Pallas splash) when it can honour the call, "
  "else the einsum ('xla')",
  choices=fused_softmax.IMPLEMENTATIONS,
)


def chunked_softmax_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  scale: Optional[float] = None,
  q_chunk: int = 256,
  k_chunk: int = 512,
  segment_ids=None,
  *,
  documents=None,
  skip: bool = True,
  bias=None,
):
  """Exact attention in O(n) memory: FlashAttention's blocks (Dao et al. 2022).

  Queries are processed `q_chunk` at a time against keys and values `k_chunk`
  at a time by online softmax (Rabe & Staats 2021); the backward pass is
  `efficient_attn.ops.flash`'s, which recomputes each block's probabilities from
  the saved log-sum-exp instead of storing them. Memory O(n d + q_chunk *
  k_chunk) per head in forward and backward, time O(n^2 d); causal masking
  skips the blocks above the diagonal. Equal to `softmax_attention` up to
  float rounding.

  Args: as `softmax_attention`; `mask` may be a key padding mask `[batch,
  kv_length]` or any mask broadcastable to `[batch, heads, q_length,
  kv_length]` (only its current chunk is read). segment_ids `[batch, length]`
  (or documents, a `masking.document_pair`): a packed row, as in
  `softmax_attention`; block pairs that share no document are skipped
  (`flash`), unless `skip=False` (to measure what skipping saves). bias: None or a pair
  (query bias `[batch, q_length, heads]`, key bias `[batch, kv_length, heads]`) added to
  every score, s_ij + (a_i + c_j), in float32 (or wider) and differentiated (`flash`; the
  forget gate of `efficient_attn.mechanisms.forgetting`).
  """
  masking.check_inputs(q, k, v, mask, name='chunked softmax attention')
  registry.check_arguments(
    'softmax_chunked', 'chunked_softmax_attention', q_chunk=q_chunk, k_chunk=k_chunk
  )
  documents = softmax_lib.documents_of(segment_ids, documents, q, k, 'chunked_softmax_attention')
  lq, lk = q.shape[1], k.shape[1]
  compute = jnp.promote_types(q.dtype, jnp.float32)
  cq, ck = min(q_chunk, lq), min(k_chunk, lk)
  pq, pk = -lq % cq, -lk % ck
  pad = lambda x, p: jnp.pad(x, ((0, 0), (0, p)) + ((0, 0),) * (x.ndim - 2)).astype(compute)
  qs = pad(q, pq) * default_scale(q.shape[-1], scale)
  if mask is not None:
    mask = jnp.asarray(mask, bool)
    if mask.ndim == 2:
      mask = mask[:, None, None, :]
    mask = jnp.pad(
      mask,
      [(0, 0), (0, 0), (0, pq if mask.shape[2] > 1 else 0), (0, pk if mask.shape[3] > 1 else 0)],
    )
  if documents is not None:
    documents = (
      jnp.pad(documents[0], ((0, 0), (0, pq)), constant_values=masking.NO_QUERY),
      jnp.pad(documents[1], ((0, 0), (0, pk)), constant_values=masking.NO_KEY),
    )
  if bias is not None:
    bias = (pad(bias[0], pq), pad(bias[1], pk))
  blocks = flash.Blocks(cq, ck, lk, bool(causal), lk - lq, skip)  # causal as masking.causal_mask
  out = flash.attend(blocks, qs, pad(k, pk), pad(v, pk), mask, documents, bias)
  return out[:, :lq].astype(v.dtype)


def _biased(s, bias):
  """Scores `[b, h, q, k]` plus a ring's bias pair (`[b, h, q]`, `[b, h, k]`), or s."""
  return s if bias is None else s + (bias[0][..., :, None] + bias[1][..., None, :])


def _dense_forward(q, k, v, key_padding, causal: bool, documents=None, bias=None):
  s = _biased(jnp.einsum('bqhd,bkhd->bhqk', q, k), bias)
  w, lse = softmax_lib.masked_softmax(s, _block_valid(q, k, key_padding, causal, documents))
  return jnp.einsum('bhqk,bkhd->bqhd', w, v), lse


def _dense_backward(q, k, v, key_padding, causal: bool, out, lse, g, documents=None, bias=None):
  s = _biased(jnp.einsum('bqhd,bkhd->bhqk', q, k), bias)
  valid = _block_valid(q, k, key_padding, causal, documents)
  p = jnp.where(valid, jnp.exp(s - lse[..., None]), 0.0)
  delta = jnp.einsum('bqhd,bqhd->bhq', g, out)
  ds = p * (jnp.einsum('bqhd,bkhd->bhqk', g, v) - delta[..., None])
  grads = (
    jnp.einsum('bhqk,bkhd->bqhd', ds, k),
    jnp.einsum('bhqk,bqhd->bkhd', ds, q),
    jnp.einsum('bhqk,bqhd->bkhd', p, g),
  )
  return grads if bias is None else grads + (ds.sum(-1), ds.sum(-2))


def _block_valid(q, k, key_padding, causal: bool, documents=None):
  valid = key_padding[:, None, None, :]
  if causal:
    valid = valid & masking.causal_mask(q.shape[1], k.shape[1])[None, None]
  if documents is not None:
    valid = valid & masking.same_document(documents)
  return valid


# Softmax's ring step (`collectives.RingBlock`): the block's [m, m] scores formed at once.
DENSE_BLOCK = collectives.RingBlock(_dense_forward, _dense_backward)


def chunked_block(q_chunk: int, k_chunk: int) -> collectives.RingBlock:
  """softmax_chunked's ring step: the block in `q_chunk` x `k_chunk` blocks
  (`flash.forward`, `flash.backward`, which skip the pairs that share no document),
  O(m d) memory."""

  def layout(q, k, key_padding, causal, documents):
    lq, lk = q.shape[1], k.shape[1]
    cq, ck = min(q_chunk, lq), min(k_chunk, lk)
    pq, pk = -lq % cq, -lk % ck
    mask = jnp.pad(key_padding, ((0, 0), (0, pk)))[:, None, None, :]
    if documents is not None:
      documents = (
        jnp.pad(documents[0], ((0, 0), (0, pq)), constant_values=masking.NO_QUERY),
        jnp.pad(documents[1], ((0, 0), (0, pk)), constant_values=masking.NO_KEY),
      )
    return flash.Blocks(cq, ck, lk, bool(causal), lk - lq), pq, pk, mask, documents

  pad = lambda x, p: jnp.pad(x, ((0, 0), (0, p)) + ((0, 0),) * (x.ndim - 2))
  # A ring's bias pair `[b, h, m]` as flash takes it: `[b, m, h]`, padded.
  tokens_first = lambda bias, pq, pk: (
    None
    if bias is None
    else (pad(jnp.swapaxes(bias[0], 1, 2), pq), pad(jnp.swapaxes(bias[1], 1, 2), pk))
  )

  def forward(q, k, v, key_padding, causal, documents=None, bias=None):
    cfg, pq, pk, mask, documents = layout(q, k, key_padding, causal, documents)
    bias = tokens_first(bias, pq, pk)
    out, lse = flash.forward(cfg, pad(q, pq), pad(k, pk), pad(v, pk), mask, documents, bias)
    lse = lse[..., : q.shape[1]]
    return out[:, : q.shape[1]], jnp.where(jnp.isfinite(lse), lse, masking.big_neg(lse.dtype))

  def backward(q, k, v, key_padding, causal, out, lse, g, documents=None, bias=None):
    cfg, pq, pk, mask, documents = layout(q, k, key_padding, causal, documents)
    lse = jnp.pad(lse, ((0, 0), (0, 0), (0, pq)), constant_values=jnp.inf)
    grads = flash.backward(
      cfg,
      pad(q, pq),
      pad(k, pk),
      pad(v, pk),
      mask,
      pad(out, pq),
      lse,
      pad(g, pq),
      documents,
      tokens_first(bias, pq, pk),
    )
    lq, lk = q.shape[1], k.shape[1]
    dq, dk, dv = grads[0][:, :lq], grads[1][:, :lk], grads[2][:, :lk]
    if bias is None:
      return dq, dk, dv
    return (
      dq,
      dk,
      dv,
      jnp.swapaxes(grads[3], 1, 2)[..., :lq],
      jnp.swapaxes(grads[4], 1, 2)[..., :lk],
    )

  return collectives.RingBlock(forward, backward)


def ring_softmax(options, q, k, v, mask, causal: bool, axis: str, block, documents=None, bias=None):
  """Ring attention (`collectives.ring_attention`) of this device's block with the options'
  scale, in float32 (or wider), returned in v's dtype. documents: this block's document
  index `[b, m]` (of the whole row) or None; bias: None or (query bias, key bias) `[b, m,
  h]` each, added to every score (`collectives.ring_attention`)."""
  compute = jnp.promote_types(q.dtype, jnp.float32)
  qs = q.astype(compute) * default_scale(q.shape[-1], options.scale)
  out = collectives.ring_attention(
    qs,
    k.astype(compute),
    v.astype(compute),
    mask,
    causal=causal,
    axis=axis,
    block=block,
    documents=documents,
    bias=None if bias is None else tuple(x.astype(compute) for x in bias),
  )
  return out.astype(v.dtype)


def _dropout(ctx):
  """(rate, rng) of attention-weight dropout in this call (0, None when off)."""
  rate = 0.0 if ctx.deterministic else ctx.dropout_rate
  return rate, (ctx.rng('dropout') if rate > 0 else None)


def _documents(q, k, mask, ctx, name: str):
  """The call's `masking.document_pair` from `ctx.documents` (None for rows of one
  document)."""
  return masking.context_documents(ctx.documents, mask, q.shape[0], q.shape[1], k.shape[1], name)


def _fused(options, q, k, v, mask, causal, ctx, dropout: bool = False):
  """The fused kernel's output if `o.implementation` picks one for this call, else None."""
  documents = _documents(q, k, mask, ctx, 'softmax')
  impl = fused_softmax.choose(
    options.implementation,
    q,
    k,
    v,
    mask,
    causal,
    dropout=dropout,
    weights=ctx.forming_weights,
    segments=documents is not None,
  )
  if impl == 'xla':
    return None
  scale = default_scale(q.shape[-1], options.scale)
  return fused_softmax.attention(impl, q, k, v, mask, causal, scale, documents=documents)


@registry.register
class Softmax(registry.Mechanism):
  name = 'softmax'
  rotary = 'scores'
  description = 'exact scaled dot-product attention'
  citation = 'Vaswani et al. 2017'
  options = (SCALE, IMPLEMENTATION)
  causal = True
  masks = 'any'
  decode = 'kv_cache'
  forms_weights = True
  complexity = ('O(n^2 d)', 'O(n^2)')
  sequence_parallel = 'ring'
  segments = True

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    return ring_softmax(options, q, k, v, mask, causal, axis, DENSE_BLOCK, ctx.documents)

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    rate, rng = _dropout(ctx)
    out = _fused(options, q, k, v, mask, causal, ctx, dropout=rng is not None)
    if out is not None:
      return out
    return softmax_attention(
      q,
      k,
      v,
      mask=mask,
      causal=causal,
      scale=options.scale,
      dropout_rate=rate,
      dropout_rng=rng,
      broadcast_dropout=ctx.broadcast_dropout,
      documents=_documents(q, k, mask, ctx, self.name),
    )


@registry.register
class ChunkedSoftmax(registry.Mechanism):
  name = 'softmax_chunked'
  rotary = 'scores'
  description = 'exact attention in O(n) memory: online softmax over blocks, recomputing backward'
  citation = 'Rabe & Staats 2021; Dao et al. 2022'
  options = (
    registry.Option('q_chunk', 256, int, 'queries per chunk', minimum=1),
    registry.Option('k_chunk', 512, int, 'keys per chunk', minimum=1),
    SCALE,
    IMPLEMENTATION,
  )
  causal = True
  masks = 'any'
  decode = 'kv_cache'
  complexity = ('O(n^2 d)', 'O(n d + c^2)')
  knob = ('k_chunk', (16, 64, 256))
  example = {'q_chunk': 8, 'k_chunk': 4}

  sequence_parallel = 'ring'
  segments = True

  def exact_options(self, length):
    return {'q_chunk': 16, 'k_chunk': 16}

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    block = chunked_block(options.q_chunk, options.k_chunk)
    return ring_softmax(options, q, k, v, mask, causal, axis, block, ctx.documents)

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    out = _fused(options, q, k, v, mask, causal, ctx)
    if out is not None:
      return out
    return chunked_softmax_attention(
      q,
      k,
      v,
      mask=mask,
      causal=causal,
      scale=options.scale,
      q_chunk=options.q_chunk,
      k_chunk=options.k_chunk,
      documents=_documents(q, k, mask, ctx, self.name),
    )

"""Exact softmax math shared by the registry and the mechanisms.

`softmax_attention` and `softmax_weights` form the full attention matrix of q
`[batch, q_length, heads, head_dim]` and k `[batch, kv_length, heads,
head_dim]` (v `[batch, kv_length, heads, v_dim]`, output `[batch, q_length,
heads, v_dim]`); `masked_softmax` is a softmax over the last axis of any scores
restricted to a validity mask. Masks follow `efficient_attn.ops.masking`. This
module imports nothing of the registry, so the registry (the default
`Mechanism.reference`) and every mechanism can use it.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp

from efficient_attn.ops import masking


def default_scale(head_dim: int, scale: Optional[float]) -> float:
  """`scale`, or 1 / sqrt(head_dim) when it is None."""
  return 1.0 / math.sqrt(head_dim) if scale is None else scale


def softmax_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  scale: Optional[float] = None,
  dropout_rate: float = 0.0,
  dropout_rng=None,
  broadcast_dropout: bool = True,
  segment_ids=None,
  *,
  documents=None,
):
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
    segment_ids: int `[batch, length]`, a packed row (self-attention; 0 is padding,
      docs/design.md "Documents"): a token attends to its own document's real tokens
      only, and a padding token's output is 0. None: one document per row.
    documents: the same as a `masking.document_pair` (a mechanism's `ctx.documents`),
      instead of segment_ids.
  """
  masking.check_inputs(q, k, v, mask, name='softmax attention')
  documents = documents_of(segment_ids, documents, q, k, 'softmax_attention')
  weights = softmax_weights(q, k, mask=mask, causal=causal, scale=scale, documents=documents)
  if dropout_rate > 0.0 and dropout_rng is not None:
    keep = 1.0 - dropout_rate
    shape = list(weights.shape)
    if broadcast_dropout:
      shape[0] = 1
      shape[1] = 1
    keep_mask = jax.random.bernoulli(dropout_rng, keep, shape)
    weights = weights * keep_mask.astype(weights.dtype) / keep
  return jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)


def documents_of(segment_ids, documents, q, k, name: str):
  """The call's `masking.document_pair` from segment_ids or documents (one of them), or
  None."""
  if segment_ids is None:
    return documents
  if documents is not None:
    raise ValueError(f'{name}: pass segment_ids or documents, not both')
  if q.shape[1] != k.shape[1]:
    raise ValueError(
      f'{name}: segment_ids pack one sequence (self-attention); got q_length={q.shape[1]} '
      f'and kv_length={k.shape[1]}'
    )
  return masking.segment_documents(segment_ids, k.shape[0], k.shape[1], name)


def valid_mask(mask, causal: bool, q_length: int, kv_length: int, documents=None):
  """bool broadcastable to `[batch, heads, q_length, kv_length]`: the mask, causal order
  and one document (`masking.document_pair` or None), or None where all is valid."""
  full = masking.combine_masks(mask, causal, q_length, kv_length)
  if documents is not None:
    same = masking.same_document(documents)
    full = same if full is None else full & same
  return full


def softmax_weights(
  q, k, mask=None, causal: bool = False, scale: Optional[float] = None, documents=None
):
  """The attention matrix `[batch, heads, q_length, kv_length]` (float32 or wider);
  documents: a `masking.document_pair` (a query sees its own document's keys) or None."""
  masking.check_inputs(q, k, k, mask, name='softmax attention')
  compute = jnp.promote_types(q.dtype, jnp.float32)
  q = q.astype(compute) * default_scale(q.shape[-1], scale)  # scale q (n d), not the scores (n^2)
  s = jnp.einsum('bqhd,bkhd->bhqk', q, k.astype(compute))
  full = valid_mask(mask, causal, q.shape[1], k.shape[1], documents)
  if full is not None:
    s = jnp.where(full, s, masking.big_neg(compute))
  w = softmax_last(s)
  if mask is not None or documents is not None or (causal and k.shape[1] < q.shape[1]):
    # A row may be fully masked (its softmax is then uniform): zero it. Otherwise the
    # masked scores sit big_neg below the row's max and exp gives exactly 0 already.
    w = jnp.where(full, w, 0.0)
  return w


@jax.custom_jvp
def softmax_last(x):
  """`jax.nn.softmax(x, axis=-1)`, with its derivative's row sums written as einsums.

  The derivative y * (dx - sum_k y dx) is the same; written as a broadcast multiply and a
  sum (as `jax.nn.softmax` writes it), its transpose (the backward pass) is a
  multiply-and-reduce over the `[..., k]` scores, which XLA on CPU ran 1.6x slower for the
  whole of `softmax`'s forward + backward at 2048 tokens (docs/results/performance.md).
  """
  return jax.nn.softmax(x, axis=-1)


@softmax_last.defjvp
def _softmax_last_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  y = softmax_last(x)
  row = jnp.einsum('...k,...k->...', y, dx)
  return y, y * dx - jnp.einsum('...k,...->...k', y, row)


def masked_softmax(scores, valid):
  """Softmax over the last axis restricted to `valid`, with its log-normaliser.

  Args:
    scores: float array `[..., k]`.
    valid: bool array broadcastable to `scores`; False entries get weight 0.

  Returns:
    (weights, lse): weights like `scores` (0 at invalid entries; a row with no
    valid entry is all 0), and lse `[...]`, the log-sum-exp of the valid
    scores of each row (`masking.big_neg` for a row with no valid entry). No
    -inf is ever formed, so gradients stay finite; invalid entries get exactly
    zero gradient.
  """
  neg = masking.big_neg(scores.dtype)
  s = jnp.where(valid, scores, neg)
  m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
  e = jnp.where(valid, jnp.exp(s - m), 0.0)
  z = jnp.sum(e, axis=-1)
  nonempty = z > 0
  z_safe = jnp.where(nonempty, z, 1.0)
  # e / z as an einsum: the gradient w.r.t. z is then a contraction, not the slow
  # multiply-and-reduce over [..., k] that a broadcast division gives on CPU.
  weights = jnp.einsum('...k,...->...k', e, 1.0 / z_safe)
  lse = jnp.where(nonempty, m[..., 0] + jnp.log(z_safe), neg)
  return weights, lse

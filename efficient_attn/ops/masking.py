"""Masks shared by every mechanism.

Conventions (the same as `flax.linen.MultiHeadDotProductAttention`):
  * a *mask* is boolean, True where a query may attend to a key, broadcastable
    to `[batch, heads, q_length, kv_length]`;
  * a *key padding mask* is boolean `[batch, kv_length]`, True for real tokens.

Mechanisms that never form the `q_length x kv_length` matrix (linear, random
features, Linformer, Nystrom) can honour only the key-padding part of a mask;
causality is requested with `causal=True`, never through the mask.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from efficient_attn.ops import segments


def big_neg(dtype) -> float:
  """A large finite negative number for `dtype` (used instead of -inf)."""
  return float(jnp.finfo(jnp.dtype(dtype)).min) / 2


def causal_mask(q_length: int, kv_length: int) -> jnp.ndarray:
  """Bool `[q_length, kv_length]`: query i sees keys j <= i + (kv_length - q_length).

  The offset aligns the last query with the last key, so a single decoding step
  (q_length = 1) sees every key.
  """
  offset = kv_length - q_length
  return jnp.arange(kv_length)[None, :] <= jnp.arange(q_length)[:, None] + offset


def key_padding_from_mask(
  mask: Optional[jnp.ndarray], batch: int, kv_length: int
) -> Optional[jnp.ndarray]:
  """Reduce a flax-style mask `[b|1, h|1, q|1, k]` to a key padding mask `[b, k]`.

  A key is kept if any (head, query) pair may attend to it. For the usual
  padding mask `make_attention_mask(q_pad, k_pad)` this recovers `k_pad`.
  A 2-D `[batch, kv_length]` input is taken as a key padding mask already.
  """
  if mask is None:
    return None
  mask = jnp.asarray(mask, dtype=bool)
  if mask.ndim == 2:
    return jnp.broadcast_to(mask, (batch, kv_length))
  if mask.ndim != 4:
    raise ValueError(
      f'mask must be [batch, heads, q_length, kv_length] or [batch, kv_length], '
      f'got shape {mask.shape}'
    )
  return jnp.broadcast_to(jnp.any(mask, axis=(1, 2)), (batch, kv_length))


def combine_masks(
  mask: Optional[jnp.ndarray], causal: bool, q_length: int, kv_length: int
) -> Optional[jnp.ndarray]:
  """A single bool mask broadcastable to `[b, h, q, k]`, or None if no masking."""
  out = None
  if mask is not None:
    mask = jnp.asarray(mask, dtype=bool)
    if mask.ndim == 2:  # key padding [b, k]
      mask = mask[:, None, None, :]
    out = mask
  if causal:
    c = causal_mask(q_length, kv_length)[None, None]
    out = c if out is None else jnp.logical_and(out, c)
  return out


def check_inputs(
  q, k, v, mask=None, *, name: str = 'attention', same_length: bool = False, qk_groups: bool = False
) -> None:
  """Raises one-line ValueErrors for inconsistent attention inputs.

  q `[batch, q_length, heads, head_dim]`, k `[batch, kv_length, heads,
  head_dim]`, v `[batch, kv_length, heads, v_dim]`; mask None, a key padding
  mask `[batch|1, kv_length]` or bool broadcastable to `[batch, heads,
  q_length, kv_length]` (each axis its size or 1). `same_length`: the
  mechanism needs q_length == kv_length. `qk_groups`: q and k may have a
  divisor of v's heads (groups each shared by several heads, e.g. Mamba-2's
  ngroups); heads are then v's.
  """
  shapes = f'q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}'
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(
      f'{name} takes q, k, v of rank 4 [batch, length, heads, head_dim], got {shapes}'
    )
  if qk_groups and q.shape[2] == k.shape[2] and q.shape[2] and v.shape[2] % q.shape[2] == 0:
    q, k = (jax.ShapeDtypeStruct(x.shape[:2] + v.shape[2:3] + x.shape[3:], x.dtype) for x in (q, k))
  b, lq, h, d = q.shape
  if k.shape[0] != b or v.shape[0] != b or k.shape[2] != h or v.shape[2] != h:
    raise ValueError(f'{name}: batch and heads of q, k, v differ: {shapes}')
  if k.shape[3] != d:
    raise ValueError(f'{name}: q and k head_dim differ: {shapes}')
  lk = k.shape[1]
  if v.shape[1] != lk:
    raise ValueError(f'{name}: k and v lengths differ ({lk} and {v.shape[1]}): {shapes}')
  if same_length and lq != lk:
    raise ValueError(f'{name} needs q_length == kv_length, got {lq} and {lk}')
  if mask is None:
    return
  shape = tuple(mask.shape)
  want = (b, lk) if len(shape) == 2 else (b, h, lq, lk)
  if len(shape) not in (2, 4) or any(s not in (1, w) for s, w in zip(shape, want)):
    raise ValueError(
      f'{name}: mask of shape {shape} does not fit q_length={lq}, '
      f'kv_length={lk}; valid: [batch, kv_length] key padding or '
      f'broadcastable to [batch={b}, heads={h}, {lq}, {lk}]'
    )


def zero_padded(x: jnp.ndarray, key_padding: Optional[jnp.ndarray]) -> jnp.ndarray:
  """Zero the rows of `x` `[b, l, ...]` at padded positions of `key_padding` `[b, l]`."""
  if key_padding is None:
    return x
  shape = key_padding.shape + (1,) * (x.ndim - 2)
  return jnp.where(key_padding.reshape(shape), x, jnp.zeros((), x.dtype))


def checked_keys_values(q, k, v, mask, *, name: str, causal: bool, qk_groups: bool = False):
  """The common start of the mechanisms that honour only key padding: check the
  inputs (`check_inputs`; causal needs q_length == kv_length), reduce `mask` to
  key padding `[batch, kv_length]` (or None) and zero the padded keys and values.

  Returns (k, v, key_padding).
  """
  check_inputs(q, k, v, mask, name=name, same_length=causal, qk_groups=qk_groups)
  key_padding = key_padding_from_mask(mask, k.shape[0], k.shape[1])
  return zero_padded(k, key_padding), zero_padded(v, key_padding), key_padding


# Packed rows: the document pair every exact form reads (docs/design.md, "Documents").

NO_QUERY, NO_KEY = -1, -2  # the documents of padded queries and keys: they meet nothing


def document_pair(documents, query_real=None, key_real=None):
  """(query documents, key documents), each int32 `[batch, length]`: `documents` (the
  document index, `ops.segments.document_index`) where the token is real, else `NO_QUERY`
  / `NO_KEY`, so a padded token meets no other (a padded query sees no key: its output
  is 0). query_real, key_real: bool `[batch, length]` or None (all real)."""
  documents = jnp.asarray(documents, jnp.int32)
  mark = lambda real, none: documents if real is None else jnp.where(real, documents, none)
  return mark(query_real, NO_QUERY), mark(key_real, NO_KEY)


def segment_documents(segment_ids, batch: int, length: int, name: str):
  """The `document_pair` of a packed self-attention call from its `segment_ids`
  `[batch, length]` (0 is padding), checked (`segments.check`) with `name` in the error."""
  ids = segments.check(segment_ids, batch, length, name)
  real = segments.is_real(ids)
  return document_pair(segments.document_index(ids), real, real)


def context_documents(documents, mask, batch: int, q_length: int, kv_length: int, name: str):
  """The `document_pair` of a mechanism's call from `ctx.documents` `[batch, length]`
  (None: rows of one document, returns None) and its mask, whose key padding
  (`key_padding_from_mask`) marks the padded tokens, queries and keys alike
  (self-attention: a packed row is one sequence)."""
  if documents is None:
    return None
  if q_length != kv_length or tuple(jnp.shape(documents)) != (batch, kv_length):
    raise ValueError(
      f'{name}: documents of shape {tuple(jnp.shape(documents))} with q_length={q_length}, '
      f'kv_length={kv_length}; valid: self-attention with documents [batch, length] = '
      f'{[batch, kv_length]}'
    )
  real = key_padding_from_mask(mask, batch, kv_length)
  return document_pair(documents, real, real)


def same_document(documents) -> jnp.ndarray:
  """bool `[batch, 1, q_length, kv_length]`: the query and key are of one document
  (`documents` a `document_pair`)."""
  query, key = documents
  return (query[:, :, None] == key[:, None, :])[:, None]


def document_ranges(documents, block: int):
  """(lowest, highest) document of each block of `block` tokens, each int32 `[batch,
  length // block]` (block divides length), over the block's real tokens only (the
  non-negative entries); a block of padding alone has lowest > highest and meets none."""
  documents = jnp.asarray(documents, jnp.int32)
  blocks = documents.reshape(documents.shape[0], -1, block)
  real = blocks >= 0
  big = jnp.iinfo(jnp.int32).max
  return jnp.min(jnp.where(real, blocks, big), -1), jnp.max(jnp.where(real, blocks, -1), -1)


def ranges_meet(query_range, key_range) -> jnp.ndarray:
  """bool `[batch, ...]`: a query block and a key block may share a document (their
  `document_ranges` overlap); where they do not, the pair of blocks can be skipped."""
  (q_low, q_high), (k_low, k_high) = query_range, key_range
  return (k_low <= q_high) & (k_high >= q_low)

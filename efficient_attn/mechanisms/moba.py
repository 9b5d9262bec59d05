"""MoBA, mixture of block attention (Lu et al. 2025): each query reads its own block and
the top-k past blocks whose mean key scores highest against it.

Keys are cut into blocks of `block_size` B positions (of each document, from its first
real token). Query t of block c attends, with one softmax, to the keys of its own block
up to t and to the keys of the top_k - 1 past blocks j < c of highest gate score
q_t . mean(K_j); the own block counts in top_k, future blocks are never read, ties go
to the earlier block. The math, and the rule alone (`select_blocks`), are in
`efficient_attn.ops.moba`.

Defaults are the paper's: block_size 512 and top_k 3 (its scaling-law runs at 8K tokens;
its 32K runs keep top_k 3 with blocks of 4096). top_k >= the number of blocks is exact
causal softmax attention.

Forms: 'tiles' (flash tiles that skip the key tiles no query of a chunk reads: at most
softmax_chunked's work, never n x n), 'gather' (each query gathers the k blocks it reads:
O(n (k B + n / B) d) time, but slow on a CPU) and 'dense' (the n x n mask of the same
selection, the reference). Causal
only: the gate ranks past blocks, and the reference code has no bidirectional form.
Decoding keeps a key/value cache; each new query selects its blocks among the cached
ones (the block means are recomputed over the cache at each call, O(L d)).
"""

from typing import Optional

import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import block_sparse
from efficient_attn.ops import masking
from efficient_attn.ops import moba as moba_lib
from efficient_attn.ops.scaled_dot_product import default_scale
from efficient_attn.ops.scaled_dot_product import documents_of

BLOCK_SIZE, TOP_K = 512, 3  # Lu et al. 2025


def moba_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = True,
  *,
  block_size: int = BLOCK_SIZE,
  top_k: int = TOP_K,
  scale: Optional[float] = None,
  form: str = 'tiles',
  q_chunk: int = 64,
  k_chunk: int = 512,
  segment_ids=None,
  documents=None,
):
  """Mixture of block attention, exact in its selection (see the module docstring).

  Args:
    q: `[batch, n, heads, head_dim]`.
    k: `[batch, n, heads, head_dim]`.
    v: `[batch, n, heads, v_dim]`.
    mask: optional bool key padding `[batch, n]` or flax-style mask (reduced to key
      padding): a padded key is never read and is left out of its block's mean; a padded
      query reads nothing (output 0).
    causal: must be True (MoBA has no bidirectional form).
    block_size: B >= 1, keys per block (paper: 512).
    top_k: k >= 1, blocks each query reads, its own included (paper: 3).
    scale: score scale, default 1/sqrt(head_dim) (the gate is unscaled: a selection).
    form: 'tiles' (flash tiles, skipping the key tiles no query of a chunk reads),
      'gather' (each query gathers its blocks) or 'dense' (the n x n reference); see
      `efficient_attn.ops.moba`.
    q_chunk: queries per chunk ('tiles', 'gather').
    k_chunk: keys per tile ('tiles').
    segment_ids: int `[batch, n]`, a packed row (0 is padding, docs/design.md
      "Documents"): blocks restart at each document, which reads only its own keys.
    documents: the same as a `masking.document_pair` (`ctx.documents`), instead.

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`.
  """
  masking.check_inputs(q, k, v, mask, name='moba_attention', same_length=True)
  if not causal:
    raise ValueError(
      'moba_attention: causal=False is not valid; MoBA is causal only (its gate picks '
      'past blocks, the own block causally); valid: causal=True'
    )
  registry.check_arguments(
    'moba',
    'moba_attention',
    block_size=block_size,
    top_k=top_k,
    form=form,
    q_chunk=q_chunk,
    k_chunk=k_chunk,
  )
  b, n = k.shape[:2]
  padding = block_sparse.key_padding(mask, b, n)
  documents = documents_of(segment_ids, documents, q, k, 'moba_attention')
  index = jnp.zeros((b, n), jnp.int32) if documents is None else documents[1]
  key_documents = jnp.where(padding & (index >= 0), index, -1)
  out = moba_lib.moba(
    q,
    k,
    v,
    key_documents,
    block_size=block_size,
    top_k=top_k,
    scale=default_scale(q.shape[-1], scale),
    form=form,
    q_chunk=q_chunk,
    k_chunk=k_chunk,
  )
  return out.astype(v.dtype)


@registry.register
class MoBA(registry.Mechanism):
  name = 'moba'
  rotary = 'scores'
  description = 'mixture of block attention: own block plus top-k past blocks by mean key'
  citation = 'Lu et al. 2025'
  options = (
    registry.Option('block_size', BLOCK_SIZE, int, 'keys per block B', minimum=1),
    registry.Option('top_k', TOP_K, int, 'blocks each query reads, its own included', minimum=1),
    registry.Option(
      'form',
      'tiles',
      str,
      "'tiles': flash tiles that skip unread key tiles; 'gather': each query gathers its "
      "blocks; 'dense': the n x n mask (reference)",
      choices=moba_lib.FORMS,
    ),
    registry.Option('q_chunk', 64, int, "queries per chunk ('tiles', 'gather')", minimum=1),
    registry.Option('k_chunk', 512, int, "keys per tile ('tiles')", minimum=1),
    SCALE,
  )
  causal = True
  causal_only = True
  decode = 'kv_cache'
  self_attention_only = True
  segments = True
  whole_sequence = "its gate ranks every past block's mean key, over the whole sequence"
  complexity = ('O(n (k B + n / B) d) to O(n^2 d)', 'O(c (c_k + n / B))')
  example = {'block_size': 4, 'top_k': 2, 'q_chunk': 8, 'k_chunk': 8}

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return moba_attention(
      q,
      k,
      v,
      mask=mask,
      causal=causal,
      block_size=options.block_size,
      top_k=options.top_k,
      scale=options.scale,
      form=options.form,
      q_chunk=options.q_chunk,
      k_chunk=options.k_chunk,
      documents=masking.context_documents(ctx.documents, mask, *q.shape[:2], k.shape[1], 'moba'),
    )

  def kv_cache_attention(self, options):
    """The decoding calls' attention over the cache: the queries at their slots select
    among the cached blocks (`ops.moba.moba`, query_start the first query's slot)."""

    def attend(q, keys, values, *, query_times, key_documents, scale=None, **unused):
      del unused  # query documents: the cache holds them at the queries' slots
      out = moba_lib.moba(
        q,
        keys,
        values,
        key_documents,
        block_size=options.block_size,
        top_k=options.top_k,
        scale=default_scale(q.shape[-1], scale),
        form=options.form,
        query_start=jnp.asarray(query_times)[0],
        q_chunk=options.q_chunk,
        k_chunk=options.k_chunk,
      )
      return out.astype(values.dtype)

    return attend

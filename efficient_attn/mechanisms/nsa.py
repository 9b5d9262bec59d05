"""Native Sparse Attention (Yuan et al. 2025): three causal branches mixed by learned gates.

  o_t = g_t^cmp Attn(q_t, K~cmp, V~cmp) + g_t^slc Attn(q_t, K^slc, V^slc)
        + g_t^win Attn(q_t, K^win, V^win),     g_t = sigmoid(x_t W_g)  (per head)

  * compressed: attention over the blocks of l keys (stride d) each compressed by an MLP
    with intra-block position encoding (`ops.nsa.compress`), those that end at or before t;
  * selected: attention over the keys of the top n blocks of l' tokens, scored by the
    compressed branch's attention, with the initial block and the two local blocks always
    among them (`ops.nsa.sparse`);
  * window: attention over the last w tokens (`mechanisms.local`).

The paper's defaults: l = 32, d = 16, l' = 64, n = 16 (1 initial + 2 local included),
w = 512. The gate is fla's projection (`g_proj`, no bias) of the layer input; fla pools
blocks by their mean with l = d = l', which is this layer with W_out = 0 (its
initialisation) and those sizes. Blocks are counted from each document's first real token,
so a packed row equals each document alone (docs/design.md, "Documents").

Forms: causal only; the blocked form (`form='sparse'`, never n x n) and its dense
reference (`form='dense'`, `ops.nsa.reference`). No decoding form yet and no split layer
(the selected blocks may lie anywhere in the past).
"""

from typing import Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import gated_family
from efficient_attn.mechanisms.local import local_attention
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import block_sparse
from efficient_attn.ops import masking
from efficient_attn.ops.nsa import compress
from efficient_attn.ops.nsa import reference
from efficient_attn.ops.nsa import sparse
from efficient_attn.ops.scaled_dot_product import default_scale
from efficient_attn.ops.scaled_dot_product import documents_of

FORMS = ('sparse', 'dense')
_COMPRESS_NAMES = ('compress_in', 'compress_out', 'position')


def check_blocks(function: str, compress_stride: int, compress_block: int, select_block: int):
  """A one-line ValueError unless d divides l and l' (each option's own range is checked
  by its `registry.Option`)."""
  for name, size in (('compress_block', compress_block), ('select_block', select_block)):
    if size % compress_stride:
      raise ValueError(
        f'{function}: compress_stride={compress_stride} must divide {name}={size} '
        f'(Yuan et al. 2025 take d | l and d | l\')'
      )


def nsa_attention(
  q,
  k,
  v,
  gates,
  params: Mapping[str, jnp.ndarray],
  *,
  compress_block: int = 32,
  compress_stride: int = 16,
  select_block: int = 64,
  num_selected: int = 16,
  window: int = 512,
  selection_heads: int = 1,
  mask=None,
  causal: bool = True,
  scale: Optional[float] = None,
  segment_ids=None,
  documents=None,
  form: str = 'sparse',
  query_block: int = 64,
):
  """Native Sparse Attention (causal), the module docstring's equation.

  Args:
    q, k: `[batch, n, heads, dk]`; v: `[batch, n, heads, dv]` (self-attention).
    gates: `[batch, n, heads, 3]` in [0, 1], the gates of the compressed, selected and
      window branches (the layer's sigmoid(x W_g)).
    params: the compression MLPs: `key_compress_in` `[l, dk, dk]`, `key_compress_out`
      `[dk, dk]`, `key_position` `[l, dk]`, and `value_...` with dv.
    compress_block, compress_stride, select_block, num_selected, window: l, d, l', n, w
      (the paper's defaults); d must divide l and l'; n >= 3 (1 initial + 2 local).
    selection_heads: consecutive heads that share one block selection, their scores
      summed (the paper's GQA group, e.g. heads / kv_heads); 1: per head. Divides heads.
    mask: key padding `[batch, n]` (or a flax-style mask reduced to it); a padded key is
      never read, a compressed block over one is excluded, a padded query outputs 0.
    causal: must be True (NSA is causal by construction).
    scale: score scale, default 1/sqrt(dk).
    segment_ids: int `[batch, n]`, a packed row (0 is padding); or `documents`, its
      `masking.document_pair`. Each document reads only itself, in all three branches.
    form: 'sparse' (blocked: each query gathers its slots and selected blocks, O(n (n/d
      + n l' + w) dk) time) or 'dense' (the n x n masked reference).
    query_block: queries per step of the sparse form (memory O(query_block (n/d + n l'))).

  Returns:
    `[batch, n, heads, dv]`, dtype of `v`; rows with nothing to read are 0.
  """
  if not causal:
    raise ValueError('nsa_attention: causal=False is not valid; NSA is causal only (causal=True)')
  if form not in FORMS:
    raise ValueError(f'nsa_attention: form={form!r} is not valid; valid: {", ".join(FORMS)}')
  registry.check_arguments(
    'nsa',
    'nsa_attention',
    compress_block=compress_block,
    compress_stride=compress_stride,
    select_block=select_block,
    num_selected=num_selected,
    window=window,
    selection_heads=selection_heads,
  )
  check_blocks('nsa_attention', compress_stride, compress_block, select_block)
  masking.check_inputs(q, k, v, mask, name='nsa_attention', same_length=True)
  b, n, h, dk = q.shape
  if tuple(gates.shape) != (b, n, h, 3):
    raise ValueError(
      f'nsa_attention: gates of shape {tuple(gates.shape)}; valid: [batch, n, heads, 3] = '
      f'{[b, n, h, 3]}'
    )
  if h % selection_heads:
    raise ValueError(
      f'nsa_attention: selection_heads={selection_heads} must divide the heads ({h})'
    )
  documents = documents_of(segment_ids, documents, q, k, 'nsa_attention')
  real = block_sparse.key_padding(mask, b, n)
  index = None
  if documents is not None:
    real = real & (documents[1] >= 0)
    index = documents[1]
  dtype = compress.compute_dtype(q, k, v)
  out_dtype = v.dtype
  q, k, v = (masking.zero_padded(x.astype(dtype), real) for x in (q, k, v))
  scale = default_scale(dk, scale)
  blocks = sparse.Blocks(
    compress_block, compress_stride, select_block, num_selected, selection_heads
  )
  if form == 'dense':
    o_cmp, o_slc, o_win = reference.branches(q, k, v, params, real, index, blocks, window, scale)
  else:
    start, position = compress.layout(real, index)
    ck, cv = (
      compress.compress(x, *(params[f'{name}_{p}'] for p in _COMPRESS_NAMES))
      for name, x in (('key', k), ('value', v))
    )
    slots = compress.slot_valid(real, position, compress_block, compress_stride)
    o_cmp, o_slc = sparse.sparse_branches(
      q, k, v, ck, cv, slots, real, start, position, blocks, scale, query_block, index is None
    )
    pair = masking.document_pair(
      index if index is not None else jnp.zeros((b, n), jnp.int32), real, real
    )
    o_win = local_attention(q, k, v, window, mask=real, causal=True, scale=scale, documents=pair)
  g = gates.astype(dtype)
  out = g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win
  return jnp.where(real[:, :, None, None], out, 0).astype(out_dtype)


def _compress_specs(prefix: str, block: int, dim: int):
  """The compression MLP of keys or values: W_in LeCun-normal over its l * dim inputs,
  W_out zero (phi starts as mean pooling), the position embedding N(0, 0.02^2)."""
  w_in = nn.initializers.variance_scaling(
    1.0, 'fan_in', 'truncated_normal', in_axis=(0, 1), out_axis=2
  )
  return {
    f'{prefix}_compress_in': registry.ParamSpec((block, dim, dim), w_in),
    f'{prefix}_compress_out': registry.ParamSpec((dim, dim), nn.initializers.zeros_init()),
    f'{prefix}_position': registry.ParamSpec((block, dim), nn.initializers.normal(0.02)),
  }


@registry.register
class NSA(registry.Mechanism):
  name = 'nsa'
  description = 'native sparse attention: compressed, selected and window branches, gated'
  citation = 'Yuan et al. 2025'
  options = (
    registry.Option('compress_block', 32, int, 'l: tokens per compressed block', minimum=1),
    registry.Option('compress_stride', 16, int, 'd: stride of the compressed blocks', minimum=1),
    registry.Option('select_block', 64, int, "l': tokens per selection block", minimum=1),
    registry.Option(
      'num_selected', 16, int, 'n: selected blocks (1 initial + 2 local included)', minimum=3
    ),
    registry.Option('window', 512, int, 'w: sliding-window tokens', minimum=1),
    registry.Option(
      'selection_heads',
      1,
      int,
      'consecutive heads sharing one selection (the GQA group; 1: per head)',
      minimum=1,
    ),
    registry.Option(
      'form', 'sparse', str, 'sparse (blocked) or dense (n x n reference)', choices=FORMS
    ),
    SCALE,
  )
  causal = True
  causal_only = True
  reads_input = True
  rotary = 'scores'
  self_attention_only = True
  segments = True
  sequence_parallel = ''
  whole_sequence = 'its selected blocks may lie anywhere in the past of each query'
  complexity = ("O(n (n/d + n_sel l' + w) d)", "O(n (n/d + n_sel l' + w))")
  example = {
    'compress_block': 4,
    'compress_stride': 2,
    'select_block': 4,
    'num_selected': 4,
    'window': 4,
  }

  def check_options(self, options):
    check_blocks(
      f'mechanism {self.name!r}',
      options.compress_stride,
      options.compress_block,
      options.select_block,
    )

  def params(self, options, *, heads, head_dim, max_length, causal):
    del heads, max_length, causal
    block = options.compress_block
    return {**_compress_specs('key', block, head_dim), **_compress_specs('value', block, head_dim)}

  def input_params(self, options, *, features, heads, head_dim):
    init = nn.initializers.variance_scaling(
      1.0, 'fan_in', 'truncated_normal', in_axis=0, out_axis=(1, 2)
    )
    return {'gate_kernel': registry.ParamSpec((features, heads, 3), init)}

  def gates(self, options, params, inputs):
    return jax.nn.sigmoid(gated_family.dense(inputs, params['gate_kernel']))

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    b, n = q.shape[:2]
    return nsa_attention(
      q,
      k,
      v,
      ctx.gates,
      params,
      compress_block=options.compress_block,
      compress_stride=options.compress_stride,
      select_block=options.select_block,
      num_selected=options.num_selected,
      window=options.window,
      selection_heads=options.selection_heads,
      mask=mask,
      causal=causal,
      scale=options.scale,
      documents=masking.context_documents(ctx.documents, mask, b, n, k.shape[1], 'nsa'),
      form=options.form,
    )

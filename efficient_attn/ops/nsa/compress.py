"""NSA's token compression (Yuan et al. 2025, section 3.3.1) and the block layout it reads.

Blocks are counted from each document's first real token (docs/design.md, "Documents"),
so a packed row's document has the blocks it has alone. For token t of a document that
begins at row `start_t`, `position_t = t - start_t`:

  * compressed block j covers rows start + j d .. start + j d + l - 1 (length l, stride d);
    it is a *slot* of the row at its last row e = start + j d + l - 1, valid when its l
    keys are all real (a block over padding is excluded, never pooled);
  * selection block i covers rows start + i l' .. start + (i + 1) l' - 1.

The compression MLP with intra-block position encoding (the paper's phi), for the block's
tokens x_1 .. x_l `[l, dim]`:

  phi(x) = mean_i x_i + W_out silu(sum_i (x_i + p_i) W_in[i])

with p `[l, dim]` the position embedding, W_in `[l, dim, hidden]`, W_out `[hidden, dim]`
(one MLP per layer, shared by the heads; keys and values each have their own). W_out
starts at zero, so phi starts as the mean pooling fla uses.
"""

import jax
from jax import lax
import jax.numpy as jnp


def compute_dtype(*xs):
  """float32, or float64 where an input is (float64 references)."""
  return jnp.promote_types(jnp.float32, jnp.result_type(*xs))


def layout(real, documents=None):
  """(start, position), each int32 `[batch, length]`: the row of each token's document's
  first real token, and t - start (meaningless for padding tokens, which read nothing).

  Args:
    real: bool `[batch, length]`, the tokens that are not padding.
    documents: int `[batch, length]`, the document index of each token (any value at
      padding), or None (one document per row).
  """
  b, n = real.shape
  index = jnp.arange(n, dtype=jnp.int32)
  docs = jnp.zeros((b, n), jnp.int32) if documents is None else jnp.asarray(documents, jnp.int32)
  docs = jnp.where(real, jnp.clip(docs, 0, n - 1), 0)
  first = jax.vmap(lambda d, r: jax.ops.segment_min(jnp.where(r, index, n), d, num_segments=n))(
    docs, real
  )
  start = jnp.minimum(jnp.take_along_axis(first, docs, axis=1), index)
  return start, index - start


def slot_valid(real, position, block: int, stride: int):
  """bool `[batch, length]`: row e ends a compressed block of its document whose `block`
  keys are all real ((position_e + 1) a multiple of `stride`, at least `block`)."""
  all_real = lax.reduce_window(
    real.astype(jnp.int32), jnp.int32(1), lax.min, (1, block), (1, 1), ((0, 0), (block - 1, 0))
  ).astype(bool)
  ends = position + 1
  return all_real & (ends % stride == 0) & (ends >= block)


def compress(x, w_in, w_out, position_embedding):
  """phi of the block of l rows ending at each row (rows before 0 read as zeros).

  Args:
    x: `[batch, length, heads, dim]` keys or values.
    w_in: `[l, dim, hidden]`; w_out: `[hidden, dim]`; position_embedding: `[l, dim]`.

  Returns:
    `[batch, length, heads, dim]` in float32 (float64 where an input is): row e holds
    phi(x_{e-l+1} .. x_e). A convolution over the rows: time O(n l dim hidden), memory
    O(n hidden), never the `[n, l, dim]` unfolding.
  """
  dtype = compute_dtype(x, w_in, w_out, position_embedding)
  b, n, h, dim = x.shape
  l = w_in.shape[0]
  x = x.astype(dtype)
  rows = jnp.moveaxis(x, 2, 1).reshape(b * h, n, dim)
  # One convolution gives the MLP's first layer and the block's mean (a kernel of I / l).
  mean_kernel = jnp.broadcast_to(jnp.eye(dim, dtype=dtype) / l, (l, dim, dim))
  kernel = jnp.concatenate([w_in.astype(dtype), mean_kernel], axis=-1)
  both = lax.conv_general_dilated(
    rows,
    kernel,
    window_strides=(1,),
    padding=((l - 1, 0),),
    dimension_numbers=('NWC', 'WIO', 'NWC'),
    precision=lax.Precision.HIGHEST,
  )
  hidden, mean = both[..., : w_in.shape[-1]], both[..., w_in.shape[-1] :]
  hidden = hidden + jnp.einsum(
    'ld,ldk->k', position_embedding.astype(dtype), w_in.astype(dtype), precision='highest'
  )
  mixed = jnp.einsum('bnk,kd->bnd', jax.nn.silu(hidden), w_out.astype(dtype), precision='highest')
  return jnp.moveaxis((mean + mixed).reshape(b, h, n, dim), 1, 2)

"""The short causal convolution of the gated recurrences (fla's ShortConvolution; Mamba-2's
conv1d): depthwise along the sequence, with its own backward, and its decoding step.

In a packed row (`segment_ids`, docs/design.md "Documents") tap i of token t reads
x_{t-K+1+i} only where that token is of t's document, forward and backward; a padding
token's input is 0 and so is its output.

Shapes: x `[batch, length, heads, d]`, kernel w `[K, heads, d]`, bias `[heads, d]`.
"""

import jax
import jax.numpy as jnp

from efficient_attn.ops.gated import documents as docs_lib
from efficient_attn.ops.gated.common import compute_dtype


def causal_conv(x, w, bias=None, *, segment_ids=None):
  """Depthwise causal convolution along the sequence: out_t = sum_i w[i] x_{t - K + 1 + i}
  (+ bias), each tap within t's document where `segment_ids` `[b, n]` is given.

  x `[b, n, h, d]`, w `[K, h, d]`, bias `[h, d]` or None -> `[b, n, h, d]` (float32; float64
  where x or w is).
  """
  dtype = compute_dtype(x, w)
  b, n = x.shape[:2]
  packed = docs_lib.packed(segment_ids, b, n, 'causal_conv')
  x = x.astype(dtype)
  keep = None
  if packed is not None:
    (x,) = docs_lib.zero_padding(packed.real, x)
    keep = taps_within_documents(packed.documents, w.shape[0])
  out = _causal_conv(x, w.astype(dtype), keep)
  out = out if bias is None else out + bias.astype(dtype)
  return out if packed is None else docs_lib.zero_padding(packed.real, out)[0]


def taps_within_documents(documents, size: int):
  """`[K, b, n]` bool: tap i of token t (x_{t-K+1+i}) is of t's document (`documents`, a
  document index `[b, n]`)."""
  n = documents.shape[1]
  padded = jnp.pad(documents, [(0, 0), (size - 1, 0)], constant_values=-1)
  return jnp.stack([padded[:, i : i + n] == documents for i in range(size)])


def _masked(x, keep, i):
  """x `[b, n, h, d]` where tap i is kept (`keep` `[K, b, n]`; None: everywhere)."""
  return x if keep is None else jnp.where(keep[i][..., None, None], x, 0)


def _taps(x, size: int):
  """The K taps of x: tap i is x_{t - K + 1 + i} `[b, n, h, d]` (zero before the row)."""
  n = x.shape[1]
  xp = jnp.pad(x, [(0, 0), (size - 1, 0), (0, 0), (0, 0)])
  return [xp[:, i : i + n] for i in range(size)]


@jax.custom_vjp
def _causal_conv(x, w, keep):
  size = w.shape[0]
  return sum(w[i] * _masked(tap, keep, i) for i, tap in enumerate(_taps(x, size)))


def _causal_conv_fwd(x, w, keep):
  return _causal_conv(x, w, keep), (x, w, keep)


def _causal_conv_bwd(res, d_out):
  # The kernel's gradient as one matrix product per tap: XLA on CPU runs the
  # multiply-and-sum over [b, n] that autodiff writes about 8x slower.
  x, w, keep = res
  size, (b, n, h, d) = w.shape[0], x.shape
  ones = jnp.ones((1, b * n), x.dtype)
  d_taps = [_masked(d_out, keep, i) for i in range(size)]  # d out_t reaching tap i
  d_w = jnp.concatenate(
    [ones @ (d_taps[i] * tap).reshape(b * n, h * d) for i, tap in enumerate(_taps(x, size))]
  ).reshape(w.shape)
  # x_s feeds tap i of token s + K - 1 - i.
  shifted = lambda y, i: jnp.pad(y, [(0, 0), (0, size - 1), (0, 0), (0, 0)])[
    :, size - 1 - i : size - 1 - i + n
  ]
  d_x = sum(w[i] * shifted(d_taps[i], i) for i in range(size))
  return d_x, d_w, None


_causal_conv.defvjp(_causal_conv_fwd, _causal_conv_bwd)


def causal_conv_step(history, x_t, w, bias=None, *, reset=None, real=None):
  """One token of `causal_conv`: history `[b, K - 1, h, d]` (the previous inputs), x_t
  `[b, 1, h, d]` -> (new history, out_t `[b, 1, h, d]`).

  reset: optional `[b]` bool, the token begins a new document (the history is cleared
  first); real: optional `[b]` bool, False for a padding token (its input enters the
  history as 0, as in the parallel form, and its output is 0)."""
  dtype = compute_dtype(history, x_t, w)
  history, x_t = history.astype(dtype), x_t.astype(dtype)
  if reset is not None:
    history = docs_lib.where_rows(~reset, history)
  if real is not None:
    x_t = docs_lib.where_rows(real, x_t)
  window = jnp.concatenate([history, x_t], axis=1)
  out = jnp.sum(window * w.astype(dtype), axis=1, keepdims=True)
  out = out if bias is None else out + bias.astype(dtype)
  if real is not None:
    out = docs_lib.where_rows(real, out)
  return window[:, 1:], out

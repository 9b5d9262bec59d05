"""The short causal convolution of the gated recurrences (fla's ShortConvolution; Mamba-2's
conv1d): depthwise along the sequence, with its own backward, and its decoding step.

Shapes: x `[batch, length, heads, d]`, kernel w `[K, heads, d]`, bias `[heads, d]`.
"""

import jax
import jax.numpy as jnp

F32 = jnp.float32


def causal_conv(x, w, bias=None):
  """Depthwise causal convolution along the sequence: out_t = sum_i w[i] x_{t - K + 1 + i}
  (+ bias).

  x `[b, n, h, d]`, w `[K, h, d]`, bias `[h, d]` or None -> `[b, n, h, d]` (float32).
  """
  out = _causal_conv(x.astype(F32), w.astype(F32))
  return out if bias is None else out + bias.astype(F32)


def _shifted_sum(x, w, reverse: bool = False):
  """sum_i w[i] x_{t - K + 1 + i} (reverse: sum_i w[i] x_{t + K - 1 - i}), zero outside."""
  size, n = w.shape[0], x.shape[1]
  pad = (0, size - 1) if reverse else (size - 1, 0)
  xp = jnp.pad(x, [(0, 0), pad, (0, 0), (0, 0)])
  at = lambda i: size - 1 - i if reverse else i
  return sum(w[i] * xp[:, at(i) : at(i) + n] for i in range(size))


@jax.custom_vjp
def _causal_conv(x, w):
  return _shifted_sum(x, w)


def _causal_conv_fwd(x, w):
  return _shifted_sum(x, w), (x, w)


def _causal_conv_bwd(res, d_out):
  # The kernel's gradient as one matrix product per tap: XLA on CPU runs the
  # multiply-and-sum over [b, n] that autodiff writes about 8x slower.
  x, w = res
  size, (b, n, h, d) = w.shape[0], x.shape
  xp = jnp.pad(x, [(0, 0), (size - 1, 0), (0, 0), (0, 0)])
  ones = jnp.ones((1, b * n), F32)
  d_w = jnp.concatenate(
    [ones @ (d_out * xp[:, i : i + n]).reshape(b * n, h * d) for i in range(size)]
  ).reshape(w.shape)
  return _shifted_sum(d_out, w, reverse=True), d_w


_causal_conv.defvjp(_causal_conv_fwd, _causal_conv_bwd)


def causal_conv_step(history, x_t, w, bias=None):
  """One token of `causal_conv`: history `[b, K - 1, h, d]` (the previous inputs), x_t
  `[b, 1, h, d]` -> (new history, out_t `[b, 1, h, d]`)."""
  window = jnp.concatenate([history, x_t.astype(F32)], axis=1)
  out = jnp.sum(window * w.astype(F32), axis=1, keepdims=True)
  return window[:, 1:], out if bias is None else out + bias.astype(F32)

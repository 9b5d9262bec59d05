"""The short causal convolution (efficient_attn.ops.short_conv) and its own backward equal the
float64 definition."""

import jax
import jax.numpy as jnp
import numpy as np

from efficient_attn.ops import segments
from efficient_attn.ops import short_conv


def _value_and_vjp(fn):
  """A jitted (d_out, *args) -> (fn(*args), the VJP of d_out): one compiled program (eagerly,
  every operation, forward and backward, would compile alone)."""

  def run(d_out, *args):
    out, vjp = jax.vjp(fn, *args)
    return out, vjp(d_out)

  return jax.jit(run)


def test_causal_conv_and_its_gradients_equal_the_float64_definition():
  """causal_conv's own backward (the kernel's gradient as matrix products) against autodiff of
  out_t = sum_i w[i] x_{t - K + 1 + i} in float64."""
  rng = np.random.default_rng(3)
  x, d_out = (rng.standard_normal((2, 7, 2, 3)) for _ in range(2))
  w = rng.standard_normal((4, 2, 3))

  def definition(x, w):
    xp = jnp.pad(x, [(0, 0), (3, 0), (0, 0), (0, 0)])
    return sum(w[i] * xp[:, i : i + x.shape[1]] for i in range(4))

  f32 = (jnp.asarray(a, jnp.float32) for a in (d_out, x, w))
  out, grads = _value_and_vjp(short_conv.causal_conv)(*f32)
  with jax.enable_x64(True):
    want, want_grads = _value_and_vjp(definition)(*(jnp.asarray(a) for a in (d_out, x, w)))
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_no_tap_crosses_a_document_boundary_forward_or_backward():
  """On packed rows (`segment_ids`: a one-token document, an id reused by a later
  document, a padding gap inside a document, trailing padding), causal_conv and its own
  backward equal the float64 definition run on each document alone (its span, a padding
  gap read as zeros: the taps are positions, as with key padding); padding's outputs are
  0."""
  ids = np.asarray([[4, 1, 1, 1, 0, 1, 2, 2, 1, 0], [0, 0, 5, 5, 5, 5, 5, 6, 6, 0]], np.int32)
  docs = np.asarray(jax.jit(segments.document_index)(ids))
  rng = np.random.default_rng(4)
  x, d_out = (rng.standard_normal((2, 10, 2, 3)) for _ in range(2))
  w = rng.standard_normal((3, 2, 3))

  def by_document(x, w):
    out = jnp.zeros_like(x)
    for r in range(2):
      for d in set(docs[r]):
        real = np.where((docs[r] == d) & (ids[r] != 0))[0]
        if real.size:
          at = np.arange(real[0], real[-1] + 1)  # the document's span
          xp = jnp.pad(x[r, at] * (ids[r, at] != 0)[:, None, None], [(2, 0), (0, 0), (0, 0)])
          y = sum(w[i] * xp[i : i + at.size] for i in range(3))
          out = out.at[r, at].set(y * (ids[r, at] != 0)[:, None, None])
    return out

  f32 = [jnp.asarray(a, jnp.float32) for a in (d_out, x, w)]
  packed = lambda x, w: short_conv.causal_conv(x, w, segment_ids=jnp.asarray(ids))
  out, grads = _value_and_vjp(packed)(*f32)
  with jax.enable_x64(True):
    want, want_grads = _value_and_vjp(by_document)(*(jnp.asarray(a) for a in (d_out, x, w)))
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
  assert not np.asarray(out)[ids == 0].any()
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)

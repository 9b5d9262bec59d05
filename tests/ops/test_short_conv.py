"""The short causal convolution (efficient_attn.ops.short_conv) and its own backward equal the
float64 definition."""

import jax
import jax.numpy as jnp
import numpy as np

from efficient_attn.ops import short_conv


def test_causal_conv_and_its_gradients_equal_the_float64_definition():
  """causal_conv's own backward (the kernel's gradient as matrix products) against autodiff of
  out_t = sum_i w[i] x_{t - K + 1 + i} in float64."""
  rng = np.random.default_rng(3)
  x, d_out = (rng.standard_normal((2, 7, 2, 3)) for _ in range(2))
  w = rng.standard_normal((4, 2, 3))

  def definition(x, w):
    xp = jnp.pad(x, [(0, 0), (3, 0), (0, 0), (0, 0)])
    return sum(w[i] * xp[:, i : i + x.shape[1]] for i in range(4))

  out, vjp = jax.vjp(short_conv.causal_conv, *(jnp.asarray(a, jnp.float32) for a in (x, w)))
  with jax.enable_x64(True):
    want, want_vjp = jax.vjp(definition, jnp.asarray(x), jnp.asarray(w))
    want_grads = want_vjp(jnp.asarray(d_out))
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
  for got, ref in zip(vjp(jnp.asarray(d_out, jnp.float32)), want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)

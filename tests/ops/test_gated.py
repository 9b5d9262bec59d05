"""The decay recurrence's chunkwise form and decoding step equal its float64 definition
(efficient_attn.ops.gated): lengths that are and are not multiples of the chunk, decays per
head and per feature, and 8K tokens of strong decay and of none."""

import gated_helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.ops import gated


def _decay_inputs(n, dg, seed=0, strength=1.0, b=1, h=2, dk=3, dv=2):
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((b, n, h, dk)) for _ in range(2))
  v = rng.standard_normal((b, n, h, dv))
  g = -strength * rng.uniform(0.0, 1.0, (b, n, h, dg))
  return q, k, v, g


@pytest.mark.parametrize('dg', [1, 3])  # retention / Mamba-2; GLA
@pytest.mark.parametrize('n', [12, 13])  # a multiple of the chunk, and not
def test_decay_forms_equal_the_recurrence(dg, n):
  q, k, v, g = _decay_inputs(n, dg)
  want = gated_helpers.per_head(gated_helpers.decay_recurrence, q, k, v, g)
  f32 = [np.asarray(a, np.float32) for a in (q, k, v, g)]
  loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a)[0]))

  @jax.jit  # one compiled program (eagerly, every operation would compile alone)
  def forms(*a):
    return (
      gated.gated_chunked(*a, chunk_size=4),
      gated.gated_scan(*a),
      [gated.gated_chunked(*a, chunk_size=4, sub_chunk=sub)[0] for sub in (1, 2)],
      jax.grad(
        loss(lambda *a: gated.gated_chunked(*a, chunk_size=4, sub_chunk=2)), argnums=(0, 1, 2, 3)
      )(*a),
    )

  (chunk, s_chunk), (naive, s_naive), subs, grads = forms(*f32)
  for sub_chunked in subs:  # sub-chunks 1, 2 of a per-feature decay's scores
    np.testing.assert_allclose(sub_chunked, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(chunk, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(naive, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(s_chunk, s_naive, atol=1e-5, rtol=1e-5)
  step = jax.jit(gated.gated_step)  # one compiled step, reused at every token
  s, outs = gated.zero_state(1, 2, 3, 2), []
  for t in range(n):
    s, out_t = step(s, *(a[:, t] for a in f32))
    outs.append(out_t)
  np.testing.assert_allclose(np.stack(outs, 1), want, atol=1e-5, rtol=1e-5)
  with jax.enable_x64(True):
    want_grads = jax.jit(jax.grad(loss(gated.gated_scan), argnums=(0, 1, 2, 3)))(
      *(jnp.asarray(a, jnp.float64) for a in (q, k, v, g))
    )
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('strength', [0.0, 30.0])  # no decay; decays down to e^-30 a token
@pytest.mark.parametrize('dg', [1, 2])
def test_decay_8k_tokens_are_finite_and_exact(strength, dg):
  n = 8192
  q, k, v, g = _decay_inputs(n, dg, seed=1, strength=strength, h=1, dk=2, dv=2)
  want = gated_helpers.per_head(gated_helpers.decay_recurrence, q, k, v, g)
  got, _ = jax.jit(lambda *a: gated.gated_chunked(*a, chunk_size=64))(
    *(jnp.asarray(a, jnp.float32) for a in (q, k, v, g))
  )
  assert np.all(np.isfinite(np.asarray(got)))
  scale = np.abs(want).max()
  np.testing.assert_allclose(got, want, atol=2e-5 * scale, rtol=1e-4)

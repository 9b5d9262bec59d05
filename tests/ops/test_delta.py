"""The (gated) delta rule's chunkwise (WY) form and decoding step equal its float64 definition
(efficient_attn.ops.delta): lengths that are and are not multiples of the chunk, with a decay
per head and without, and 8K tokens of strong decay and of none."""

import gated_helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.ops import delta
from efficient_attn.ops.gated.reference import zero_state


def _delta_inputs(n, seed=0, gated=True, strength=1.0, b=1, h=2, dk=3, dv=2):
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((b, n, h, dk)) for _ in range(2))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the mechanisms' L2-normalised keys
  v = rng.standard_normal((b, n, h, dv))
  beta = rng.uniform(0.0, 1.0, (b, n, h))
  g = -strength * rng.uniform(0.0, 1.0, (b, n, h, 1)) if gated else None
  return q, k, v, g, beta


def _delta_reference(q, k, v, g, beta):
  if g is None:
    return gated_helpers.per_head(gated_helpers.delta_recurrence, q, k, v, beta)
  return gated_helpers.per_head(gated_helpers.delta_recurrence, q, k, v, beta, g)


@pytest.mark.parametrize('gated', [False, True])  # DeltaNet; Gated DeltaNet
@pytest.mark.parametrize('n', [12, 13])
def test_delta_rule_forms_equal_the_recurrence(gated, n):
  q, k, v, g, beta = _delta_inputs(n, gated=gated)
  want = _delta_reference(q, k, v, g, beta)
  f32 = lambda a: None if a is None else jnp.asarray(a, jnp.float32)
  args = [f32(a) for a in (q, k, v, g, beta)]
  chunk, s_chunk = delta.delta_chunked(*args, chunk_size=4)
  naive, s_naive = delta.delta_scan(*args)
  np.testing.assert_allclose(chunk, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(naive, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(s_chunk, s_naive, atol=1e-5, rtol=1e-5)
  s, outs = zero_state(1, 2, 3, 2), []
  for t in range(n):
    s, out_t = delta.delta_step(s, *(None if a is None else a[:, t] for a in args))
    outs.append(out_t)
  np.testing.assert_allclose(jnp.stack(outs, 1), want, atol=1e-5, rtol=1e-5)
  argnums = (0, 1, 2, 3, 4) if gated else (0, 1, 2, 4)
  loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a)[0]))
  grads = jax.grad(loss(lambda *a: delta.delta_chunked(*a, chunk_size=4)), argnums=argnums)(*args)
  with jax.enable_x64(True):
    want_grads = jax.grad(loss(delta.delta_scan), argnums=argnums)(
      *(None if a is None else jnp.asarray(a, jnp.float64) for a in (q, k, v, g, beta))
    )
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('strength', [None, 30.0])  # DeltaNet (no decay); strong decay
def test_delta_rule_8k_tokens_are_finite_and_exact(strength):
  n = 8192
  q, k, v, g, beta = _delta_inputs(
    n, seed=1, gated=strength is not None, strength=strength or 0.0, h=1, dk=2, dv=2
  )
  want = _delta_reference(q, k, v, g, beta)
  got, _ = jax.jit(lambda *a: delta.delta_chunked(*a, chunk_size=64))(
    *(None if a is None else jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta))
  )
  assert bool(jnp.all(jnp.isfinite(got)))
  np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=1e-4)

"""`layers.non_finite`: which outputs a NaN or Inf poisons, by document and padding.

The registry-wide properties (NaN and Inf in padded and in future tokens, every mechanism
and projection) are tests/layers/test_attention.py's; here the rule itself, on small rows.
"""

import jax
import jax.numpy as jnp
import numpy as np

import efficient_attn as ea
from efficient_attn.layers import non_finite
from efficient_attn.ops import segments


def test_a_bad_token_poisons_its_document_from_itself_on():
  bad = jnp.array([[False, True, False, False, False, False], [False] * 5 + [True]])
  documents = jnp.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2]])
  np.testing.assert_array_equal(
    non_finite.after_non_finite(bad, documents),
    [[False, True, True, False, False, False], [False] * 5 + [True]],
  )
  np.testing.assert_array_equal(
    non_finite.after_non_finite(bad), [[False] + [True] * 5, [False] * 5 + [True]]
  )


def test_padding_poisons_nothing_and_entries_become_zero():
  q = jnp.ones((1, 4, 1, 2)).at[0, 0, 0, 1].set(jnp.nan).at[0, 2, 0, 0].set(jnp.inf)
  used = jnp.array([[False, True, True, True]])  # the NaN is in padding, the Inf is not
  q2, k2, v2, inputs, poisoned = non_finite.guard_future(q, q, q, None, mask=used, documents=None)
  np.testing.assert_array_equal(poisoned, [[False, False, True, True]])
  assert inputs is None
  for x in (q2, k2, v2):
    assert np.isfinite(x).all() and float(x[0, 0, 0, 1]) == 0.0 and float(x[0, 2, 0, 0]) == 0.0
  out = non_finite.poison(jnp.ones((1, 4, 3, 2)), poisoned)
  np.testing.assert_array_equal(np.isnan(out).any(axis=(2, 3)), poisoned)
  weights = non_finite.poison(jnp.ones((1, 3, 4, 4)), poisoned, axis=2)
  np.testing.assert_array_equal(np.isnan(weights).any(axis=(1, 3)), poisoned)


def test_a_nan_in_one_packed_document_leaves_the_next_one_exact():
  """A causal layer on a packed row: a NaN in document 1 poisons the rest of document 1
  only; document 2's outputs equal those of the clean row (and the test can fail: they
  differ where document 1 is poisoned)."""
  ids = jnp.array([[1] * 6 + [2] * 6])
  x = jax.random.normal(jax.random.key(0), (1, 12, 8))
  dirty = x.at[0, 3].set(jnp.nan)
  layer = ea.MultiHeadAttention(num_heads=2, mechanism='softmax', causal=True)
  variables = layer.init(jax.random.key(1), x, segment_ids=ids)
  apply = jax.jit(lambda z: layer.apply(variables, z, segment_ids=ids))
  clean, poisoned = np.asarray(apply(x)), np.asarray(apply(dirty))
  assert segments.document_index(ids)[0, 6] == 1
  np.testing.assert_array_equal(poisoned[0, :3], clean[0, :3])
  assert np.isnan(poisoned[0, 3:6]).all()
  np.testing.assert_allclose(poisoned[0, 6:], clean[0, 6:], rtol=1e-6)

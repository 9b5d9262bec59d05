"""Prefill (a decoding call of n > 1 tokens, one parallel pass) then decode equals the
parallel causal pass, for every mechanism with a decoding form; with packed rows, a row
that starts a new document in the middle of a call resets its state."""

from flax import nnx
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_packed import PACKED
from test_packed import DenseReference

import efficient_attn as ea
from efficient_attn.layers import decoding
import efficient_attn.nnx as ean

B, L, D, H = 2, 12, 16, 2
SPLIT = 7  # the prompt: tokens 0..6 in one call, then one token a call
# Two packed rows: documents that begin inside the prompt and inside the steps, one that
# goes on from the prompt into the steps, a padding token between two of one document's,
# a reused id and trailing padding.
IDS = np.array([[1, 1, 2, 2, 2, 0, 2, 2, 3, 1, 1, 0], [4, 4, 4, 4, 4, 4, 5, 5, 0, 5, 6, 6]])


def _prefill_then_steps(layer, variables, x, *segment_ids):
  """The outputs `[B, L, ...]` of `layer.clone(decode=True)` given x[:, :SPLIT] in one call
  and the rest one token a call (segment ids alongside): one array per entry of
  `segment_ids` (None: without ids; none given: one run without), each from the same empty
  cache through the same jitted call."""
  dec = layer.clone(decode=True)
  empty = helpers.empty_cache(dec, variables, x)
  call = jax.jit(
    lambda c, xt, ids: dec.apply({**variables, **c}, xt, segment_ids=ids, mutable=['cache'])
  )
  part = lambda a, lo, hi: None if a is None else a[:, lo:hi]
  runs = []
  for ids in segment_ids or (None,):
    out, cache = call(empty, x[:, :SPLIT], part(ids, 0, SPLIT))
    outs = [out]
    for t in range(SPLIT, L):
      out, cache = call(cache, x[:, t : t + 1], part(ids, t, t + 1))
      outs.append(out)
    runs.append(jnp.concatenate(outs, axis=1))
  return runs


def _layer(mechanism, **kw):
  decl = ea.get_mechanism(mechanism) if isinstance(mechanism, str) else mechanism
  return ea.MultiHeadAttention(num_heads=H, mechanism=decl, causal=True, options=decl.example, **kw)


@pytest.mark.parametrize('mechanism', decoding.decodable_mechanisms())
def test_prefill_then_decode_matches_parallel(mechanism):
  x = jax.random.normal(jax.random.PRNGKey(0), (B, L, D))
  layer = _layer(mechanism)
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  (decoded,) = _prefill_then_steps(layer, variables, x)
  np.testing.assert_allclose(
    decoded,
    jax.jit(layer.apply)(variables, x),
    atol=2e-5,
    rtol=2e-5,
  )


PACKED_DECODABLE = [d for d in PACKED if d.decode]


@pytest.mark.parametrize(
  'decl, rotary',
  [(d, False) for d in PACKED_DECODABLE] + [(DenseReference(), True)],
  ids=lambda p: p.name if hasattr(p, 'name') else ('rotary' if p else 'plain'),
)
def test_packed_prefill_then_decode_matches_the_packed_parallel_pass(decl, rotary):
  """Documents begin inside the prompt and between steps; each token reads its own
  document only, with rotary positions restarting at each (a padding token's output is
  not compared: it has none to read)."""
  x = jax.random.normal(jax.random.PRNGKey(0), (B, L, D))
  ids = jnp.asarray(IDS)
  layer = _layer(decl, rotary=rotary)
  variables = jax.jit(layer.init)(jax.random.PRNGKey(1), x)
  variables = jax.jit(lambda vs: jax.tree.map(lambda p: p * 2.0, vs))(variables)
  decoded, without_ids = _prefill_then_steps(layer, variables, x, ids, None)
  parallel = jax.jit(lambda v, x: layer.apply(v, x, segment_ids=ids))(variables, x)
  real = np.asarray(IDS != 0)
  np.testing.assert_allclose(decoded[real], parallel[real], atol=2e-5, rtol=2e-5)
  # The cache masks the older documents: without the ids the outputs differ.
  assert not np.allclose(without_ids[real], parallel[real], atol=1e-3)


def test_a_decoding_call_refuses_segment_ids_for_a_mechanism_without_segments():
  mechanism = next(m for m in decoding.decodable_mechanisms() if not ea.get_mechanism(m).segments)
  x = jnp.ones((1, 4, D))
  layer = _layer(mechanism, decode=True)
  variables = jax.jit(layer.init)(jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match=f'{mechanism!r} cannot keep packed documents apart'):
    layer.apply(variables, x[:, :2], segment_ids=jnp.ones((1, 2), jnp.int32), mutable=['cache'])


def test_the_nnx_layer_prefills_and_decodes_packed_rows_as_its_parallel_pass():
  x = jax.random.normal(jax.random.PRNGKey(0), (B, L, D))
  ids = jnp.asarray(IDS)
  # Built, run and stepped by compiled programs (nnx.jit carries the cache's updates back
  # to the layer): eagerly, each of its operations would compile on its own.
  layer = nnx.jit(
    lambda: ean.MultiHeadAttention(
      H, D, mechanism=DenseReference(), causal=True, rotary=True, rngs=nnx.Rngs(0)
    )
  )()
  parallel = nnx.jit(lambda m, x, ids: m(x, segment_ids=ids))(layer, x, ids)
  nnx.jit(lambda m: m.init_cache(x.shape))(layer)
  step = nnx.jit(lambda m, x, ids: m(x, segment_ids=ids, decode=True))
  outs = [step(layer, x[:, :SPLIT], ids[:, :SPLIT])]
  for t in range(SPLIT, L):
    outs.append(step(layer, x[:, t : t + 1], ids[:, t : t + 1]))
  real = np.asarray(IDS != 0)
  np.testing.assert_allclose(jnp.concatenate(outs, 1)[real], parallel[real], atol=2e-5, rtol=2e-5)

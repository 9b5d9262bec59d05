"""A `CausalTransformer` on packed rows (`segment_ids`): each document as if alone, learned
and rotary positions restarting at each; the scored `positions` keep their meaning; prefill
then decode equals the packed parallel pass; a mechanism without segments refuses."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn import registry
from efficient_attn.models import CausalTransformer
from efficient_attn.models import TransformerConfig
from efficient_attn.ops import segments

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), 'layers'))
from test_packed import DenseReference  # noqa: E402  (the layers' test mechanism)
from test_packed import documents_of  # noqa: E402

N, VOCAB = 24, 11


def _model(**kw):
  config = dict(
    d_model=16, depth=2, num_heads=2, mlp_dim=32, max_length=N, mechanism=DenseReference()
  )
  return CausalTransformer(TransformerConfig(**{**config, **kw}), vocab_size=VOCAB)


HYBRID = {'mechanism': 'linear+local', 'options': {'window': 6, 'chunk_size': 4}}


@pytest.mark.parametrize(
  'kw',
  [{'rotary': True}, {'reversible': True}, HYBRID],
  ids=['rotary', 'reversible', 'hybrid'],
)
def test_a_packed_row_equals_its_documents_alone(kw):
  """Logits and parameter gradients of two packed rows equal those of each document at the
  start of its own row (learned positions from 0 there). The hybrid alternates linear
  attention (chunks of 4) and a local window of 6 across the layers."""
  rows = [documents_of(seed) for seed in (2, 3)]
  ids = jnp.asarray(np.stack([r[0] for r in rows]))
  docs = [(row, s, l) for row, (_, d) in enumerate(rows) for s, l in d]
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, N), 0, VOCAB + 1)
  ct = jax.random.normal(jax.random.PRNGKey(1), (2, N, VOCAB)) * (ids != 0)[..., None]
  # Each document copied to the start of its own row in NumPy (eager updates of slices of
  # every length would each compile).
  alone = np.array(jax.random.randint(jax.random.PRNGKey(2), (len(docs), N), 0, VOCAB + 1))
  ct_alone = np.zeros((len(docs), N, VOCAB), np.float32)
  packed_tokens, packed_ct = np.asarray(tokens), np.asarray(ct)
  for i, (row, s, l) in enumerate(docs):
    alone[i, :l] = packed_tokens[row, s : s + l]
    ct_alone[i, :l] = packed_ct[row, s : s + l]
  alone, ct_alone = jnp.asarray(alone), jnp.asarray(ct_alone)
  model = _model(**kw)
  params = jax.jit(model.init)(jax.random.PRNGKey(3), tokens)['params']

  @jax.jit
  def run(params):
    packed = lambda p: model.apply({'params': p}, tokens, segment_ids=ids)
    single = lambda p: model.apply({'params': p}, alone)
    grad = lambda f, c: jax.grad(lambda p: jnp.sum(f(p) * c))(params)
    return packed(params), single(params), grad(packed, ct), grad(single, ct_alone)

  logits, logits_alone, g, g_alone = run(params)
  for i, (row, s, l) in enumerate(docs):
    np.testing.assert_allclose(
      logits[row, s : s + l], logits_alone[i, :l], atol=1e-5, rtol=1e-5, err_msg=f'doc {i}'
    )
  leaves, leaves_alone = jax.tree.leaves(g), jax.tree.leaves(g_alone)
  scale = max(1.0, *(float(np.max(np.abs(x))) for x in leaves_alone))
  for a, b in zip(leaves, leaves_alone):
    np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=1e-5)


def test_scored_positions_and_segment_positions_keep_their_meaning():
  """`positions=` gives the logits at those positions only; `segment_positions=` replaces
  the learned positions the segment ids would give (and equal ones change nothing)."""
  ids = jnp.asarray(np.stack([documents_of(seed)[0] for seed in (2, 3)]))
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, N), 0, VOCAB + 1)
  model = _model()
  params = jax.jit(model.init)(jax.random.PRNGKey(3), tokens)
  scored = jnp.asarray([[0, 5, 23], [1, 2, 9]])

  @jax.jit  # the four passes in one compiled program
  def run(params):
    apply = lambda **kw: model.apply(params, tokens, segment_ids=ids, **kw)
    return (
      apply(),
      apply(positions=scored),
      apply(segment_positions=segments.positions(ids)),
      apply(segment_positions=segments.positions(ids) + 1),
    )

  full, at_scored, same, shifted = run(params)
  np.testing.assert_allclose(
    at_scored,
    np.take_along_axis(np.asarray(full), np.asarray(scored)[..., None], axis=1),
    atol=1e-6,
  )
  np.testing.assert_allclose(same, full, atol=1e-6)
  assert not np.allclose(shifted, full, atol=1e-3)


def test_packed_prefill_then_decode_matches_the_parallel_pass():
  """A prompt of two documents per row in one call (prefill), then one token a call, a
  row starting a new document there: the logits of the packed parallel pass."""
  ids = jnp.asarray([[1] * 5 + [2] * 9 + [3] * 4 + [0] * 6, [7] * 12 + [8] * 12])
  prompt = 10
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, N), 0, VOCAB + 1)
  model = _model(rotary=True)
  params = jax.jit(model.init)(jax.random.PRNGKey(3), tokens)['params']
  params = jax.jit(lambda ps: jax.tree.map(lambda p: p * 2.0, ps))(params)
  parallel = jax.jit(lambda p: model.apply({'params': p}, tokens, segment_ids=ids))(params)
  decoder = model.clone(decode=True)
  variables = jax.jit(  # the empty cache, made by the first decoding call
    lambda p: decoder.apply({'params': p}, jnp.zeros_like(tokens), mutable=['cache'])[1]
  )(params)
  call = jax.jit(
    lambda cache, t, i: decoder.apply(
      {'params': params, 'cache': cache}, t, segment_ids=i, mutable=['cache']
    )
  )
  logits, variables = call(variables['cache'], tokens[:, :prompt], ids[:, :prompt])
  outs = [logits]
  for t in range(prompt, N):
    logits, variables = call(variables['cache'], tokens[:, t : t + 1], ids[:, t : t + 1])
    outs.append(logits)
  decoded = jnp.concatenate(outs, 1)
  real = np.asarray(ids != 0)
  np.testing.assert_allclose(decoded[real], parallel[real], atol=1e-4, rtol=1e-4)


def test_a_mechanism_without_segments_refuses_them_in_one_line():
  refusing = registry.names_where(lambda m: m.causal and not m.segments)
  if not refusing:
    pytest.skip('every causal mechanism declares segments')
  model = _model(mechanism=refusing[0])
  tokens = jnp.zeros((1, N), jnp.int32)
  with pytest.raises(ValueError, match=f'{refusing[0]!r} cannot keep packed documents apart') as e:
    model.init(jax.random.PRNGKey(0), tokens, segment_ids=jnp.ones((1, N), jnp.int32))
  assert '\n' not in str(e.value)

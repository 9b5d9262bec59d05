"""Packed rows (`segment_ids`) through the layers: a packed row equals each of its
documents run alone, outputs and gradients, for every mechanism that declares
`segments`; every other mechanism refuses segment ids in one line with its reason.

Over the registry, so each mechanism that comes to declare `segments` is covered when it
does (docs/design.md, "Documents"). `DenseReference` (softmax with the dense mask of
`ops.segments`, declared here only) keeps the layers' own part (document index, key
padding, positions, the refusals around them) tested whatever the registry declares.
"""

import functools

from flax import nnx
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.mechanisms import softmax
import efficient_attn.nnx as ean
from efficient_attn.ops import segments
from efficient_attn.ops.scaled_dot_product import softmax_attention

N, D, H = 24, 16, 2  # a row of 24 tokens (several chunks of 4 or 8), 2 heads of 8
CHUNK = 8  # the chunk boundary a document must cross where a mechanism has no chunk_size


class DenseReference(softmax.Softmax):
  """Softmax over the dense mask of a packed row (`ops.segments`): same document, both
  tokens real, s <= t if causal. Declared here only (not registered)."""

  name = 'dense_reference'
  segments = True
  sequence_parallel = ''
  whole_sequence = 'a test mechanism'

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    n = k.shape[1]
    real = jnp.ones(k.shape[:2], bool) if mask is None else jnp.asarray(mask).reshape(-1, n)
    allowed = real[:, None, None, :]
    if ctx.documents is not None:
      allowed = allowed & segments.same_document(ctx.documents, ctx.documents)[:, None]
    return softmax_attention(q, k, v, mask=allowed, causal=causal, scale=options.scale)


PACKED = (DenseReference(),) + tuple(m for m in registry.mechanisms() if m.segments)
REFUSING = tuple(m for m in registry.mechanisms() if not m.segments)


def documents_of(seed: int, chunk: int = CHUNK, n: int = N):
  """A packed row's segment ids `[n]` and its documents [(start, length)]: random lengths,
  one of length 1, one crossing a multiple of `chunk`, trailing padding; ids random in
  1..3 (a later document may reuse an earlier one's id, never its neighbour's)."""
  rng = np.random.default_rng(seed)
  while True:
    padding = int(rng.integers(1, 4))
    cuts = np.sort(rng.choice(np.arange(1, n - padding), size=4, replace=False))
    bounds = [0, *cuts.tolist(), n - padding]
    docs = [(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]
    crosses = any(s % chunk and s // chunk != (s + l - 1) // chunk for s, l in docs)
    if any(l == 1 for _, l in docs) and crosses:
      break
  ids, last = np.zeros(n, np.int32), 0
  for s, l in docs:
    last = int(rng.choice([i for i in (1, 2, 3) if i != last]))
    ids[s : s + l] = last
  return ids, docs


def _layer(decl, causal: bool, **kw):
  kw.setdefault('max_length', N if decl.fixed_length else None)
  return ea.MultiHeadAttention(
    num_heads=H, mechanism=decl, causal=causal, options=decl.example, **kw
  )


def _chunk(decl) -> int:
  return decl.resolve(decl.example).get('chunk_size') or CHUNK


@functools.lru_cache(maxsize=None)
def _packed_and_alone(decl, causal: bool):
  """A jitted (variables, x, x_alone, ct, ct_alone) -> ((packed out, grads), (alone out,
  grads)) for the layer of `decl`: the packed rows with their segment ids, the documents
  alone with key padding; one compile per mechanism and direction."""
  layer = _layer(decl, causal)

  def run(variables, x, x_alone, ct, ct_alone, ids, real_alone):
    packed = lambda v, x: jnp.sum(layer.apply(v, x, segment_ids=ids) * ct)
    alone = lambda v, x: jnp.sum(layer.apply(v, x, mask=real_alone) * ct_alone)
    out = layer.apply(variables, x, segment_ids=ids)
    out_alone = layer.apply(variables, x_alone, mask=real_alone)
    return (
      (out, jax.grad(packed, argnums=(0, 1))(variables, x)),
      (out_alone, jax.grad(alone, argnums=(0, 1))(variables, x_alone)),
    )

  return layer, jax.jit(run)


def _causal_forms(decl):
  return (True,) if decl.causal_only else (True, False) if decl.causal else (False,)


@pytest.mark.parametrize(
  'decl, causal',
  [(d, c) for d in PACKED for c in _causal_forms(d)],
  ids=lambda p: p.name if isinstance(p, registry.Mechanism) else ('causal' if p else 'bidi'),
)
def test_a_packed_row_equals_its_documents_alone(decl, causal):
  """Two packed rows against each of their documents alone (each at the start of its own
  row, key padding after it): the outputs at the real tokens and the gradients of the
  parameters and inputs agree to 1e-5 in float32; padding gets no gradient."""
  rows = [documents_of(seed, _chunk(decl)) for seed in (0, 1)]
  ids = jnp.asarray(np.stack([r[0] for r in rows]))
  docs = [(row, s, l) for row, (_, d) in enumerate(rows) for s, l in d]
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  # The rows are laid out in NumPy: an eager slice or update compiles once per shape.
  x = np.asarray(jax.random.normal(keys[0], (2, N, D)))
  ct = np.asarray(jax.random.normal(keys[1], (2, N, D))) * np.asarray(ids != 0)[..., None]
  x_alone = np.array(jax.random.normal(keys[2], (len(docs), N, D)))  # padding after each doc
  ct_alone = np.zeros_like(x_alone)
  real_alone = np.zeros((len(docs), N), bool)
  for i, (row, s, l) in enumerate(docs):
    x_alone[i, :l] = x[row, s : s + l]
    ct_alone[i, :l] = ct[row, s : s + l]
    real_alone[i, :l] = True
  layer, run = _packed_and_alone(decl, causal)
  variables = helpers.random_variables(layer, x)  # no init to compile; far from uniform
  (out, (g_params, g_x)), (out_alone, (g_params_alone, g_x_alone)) = run(
    variables, x, x_alone, ct, ct_alone, ids, jnp.asarray(real_alone)
  )
  # 1e-5 of each quantity's scale (float32 round-off of values that reach ~40).
  tol = lambda a: dict(atol=1e-5 * max(1.0, float(np.max(np.abs(a)))), rtol=1e-5)
  for i, (row, s, l) in enumerate(docs):
    np.testing.assert_allclose(
      out[row, s : s + l], out_alone[i, :l], **tol(out_alone), err_msg=f'doc {i}'
    )
    np.testing.assert_allclose(
      g_x[row, s : s + l], g_x_alone[i, :l], **tol(g_x_alone), err_msg=f'doc {i}'
    )
  np.testing.assert_array_equal(g_x * (ids == 0)[..., None], 0)  # padding reaches nothing
  assert np.all(np.isfinite(out))
  flat, flat_alone = jax.tree.leaves(g_params), jax.tree.leaves(g_params_alone)
  # A parameter's gradient sums over every token: 1e-5 of the largest one (a gradient
  # that is 0 in exact arithmetic, e.g. the key bias's under softmax, is float32 noise).
  scale = max(1.0, *(float(np.max(np.abs(g))) for g in flat_alone))
  assert any(np.any(g != 0) for g in flat)
  for g, g_alone in zip(flat, flat_alone):
    np.testing.assert_allclose(g, g_alone, atol=1e-5 * scale, rtol=1e-5)


def test_the_packed_layout_has_what_the_property_needs():
  """`documents_of`: a length-1 document, one across a chunk boundary, trailing padding,
  and a document index that steps at every run (ids reused later)."""
  ids, docs = documents_of(0)
  assert ids[-1] == 0 and min(l for _, l in docs) == 1
  index = np.asarray(segments.document_index(ids[None]))[0]
  for d, (s, l) in enumerate(docs):
    assert np.all(index[s : s + l] == d)


@pytest.mark.parametrize('decl', REFUSING, ids=lambda d: d.name)
def test_a_mechanism_without_segments_refuses_them_in_one_line(decl):
  causal = decl.causal_only
  x = jnp.ones((1, N, D))
  ids = jnp.ones((1, N), jnp.int32)
  with pytest.raises(ValueError, match='segment_ids') as e:
    _layer(decl, causal).init(jax.random.PRNGKey(0), x, segment_ids=ids)
  message = str(e.value)
  assert '\n' not in message and decl.no_segments in message and repr(decl.name) in message


def test_every_refusal_names_a_reason():
  for decl in REFUSING:
    assert decl.no_segments.strip(), decl.name


def test_nnx_and_make_attention_fn_refuse_as_the_linen_layer():
  decl = REFUSING[0]
  x = jnp.ones((1, N, D))
  ids = jnp.ones((1, N), jnp.int32)
  layer = ean.MultiHeadAttention(
    num_heads=H,
    in_features=D,
    mechanism=decl.name,
    causal=decl.causal_only,
    options=decl.example,
    max_length=N if decl.fixed_length else None,
    decode=False,
    rngs=nnx.Rngs(0),
  )
  with pytest.raises(ValueError, match=f"{decl.name!r} cannot keep packed documents apart"):
    layer(x, segment_ids=ids)
  if not decl.causal_only:
    fn = ea.make_attention_fn(decl.name, **decl.example)
    q = jnp.ones((1, N, H, D // H))
    with pytest.raises(ValueError, match=f"{decl.name!r} cannot keep packed documents apart"):
      fn(q, q, q, segment_ids=ids)


def test_segment_ids_refuse_what_a_packed_row_cannot_be():
  """Cross-attention, a mask that is not key padding, a wrong shape or dtype, the super
  projection: one line each, naming the value and the valid ones."""
  decl = DenseReference()
  x = jnp.ones((1, N, D))
  ids = jnp.ones((1, N), jnp.int32)
  layer = _layer(decl, True)
  variables = jax.jit(layer.init)(jax.random.PRNGKey(0), x)
  cases = [
    (dict(inputs_k=x[:, :8], segment_ids=ids), 'cross-attention'),
    (dict(mask=jnp.ones((1, 1, N, N), bool), segment_ids=ids), 'may only be key padding'),
    (dict(segment_ids=ids[:, :5]), r'segment_ids of shape \(1, 5\).*valid'),
    (dict(segment_ids=ids.astype(jnp.float32)), 'an integer dtype'),
    (dict(positions=jnp.zeros((1, 5), jnp.int32)), r'positions of shape \(1, 5\)'),
  ]
  for kwargs, match in cases:
    with pytest.raises(ValueError, match=match) as e:
      layer.apply(variables, x, **kwargs)
    assert '\n' not in str(e.value)
  with pytest.raises(ValueError, match="projection 'super'"):
    _layer(decl, True, projection='super', max_length=N).init(
      jax.random.PRNGKey(0), x, segment_ids=ids
    )


def test_make_attention_fn_passes_segment_ids_to_the_mechanism():
  """flax's attention with `make_attention_fn(...)` and the segment ids bound in: the dense
  mask of `ops.segments` at every real query."""
  ids = jnp.asarray(documents_of(0)[0][None])
  q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, N, H, D // H))
  fn = ea.make_attention_fn(DenseReference())
  out = fn(q, k, v, segment_ids=ids, is_causal=True)
  expected = softmax_attention(q, k, v, mask=segments.attention_mask(ids, causal=True))
  real = np.asarray(ids != 0)
  np.testing.assert_allclose(out[real], expected[real], atol=1e-6)

"""Tests of MoBA (efficient_attn.mechanisms.moba, efficient_attn.ops.moba) against a plain
float64 reference: per query, pick the blocks, then one softmax over the picked keys."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn.mechanisms import moba
from efficient_attn.ops import moba as moba_lib
from efficient_attn.ops import moba_blocks
from efficient_attn.ops import segments
from efficient_attn.ops.scaled_dot_product import softmax_attention

B, N, H, D = 2, 29, 2, 4  # 29 tokens: several blocks of 4 or 5, a partial last one

moba_attention = jax.jit(
  moba.moba_attention,
  static_argnames=('block_size', 'top_k', 'form', 'q_chunk', 'k_chunk', 'causal'),
)


def np_moba(q, k, v, ids, block_size, top_k):
  """MoBA in float64 NumPy, one query at a time: the query's document is the run of its
  segment id (0: padding, reads nothing), its blocks are counted from the document's first
  token, block j's gate is q . the mean of the block's real keys, and the query reads its
  own block up to itself plus the top_k - 1 past blocks of highest gate (ties: earlier)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  docs = np.asarray(segments.document_index(jnp.asarray(ids)))
  out = np.zeros(q.shape[:3] + v.shape[3:])
  for b in range(q.shape[0]):
    for t in range(q.shape[1]):
      if ids[b, t] == 0:
        continue
      mine = [s for s in range(q.shape[1]) if ids[b, s] != 0 and docs[b, s] == docs[b, t]]
      block = {s: (s - mine[0]) // block_size for s in mine}
      for h in range(q.shape[2]):
        gate = {}
        for s in mine:
          if block[s] < block[t]:
            gate.setdefault(block[s], []).append(k[b, s, h])
        gate = {j: q[b, t, h] @ np.mean(keys, 0) for j, keys in gate.items()}
        picked = sorted(gate, key=lambda j: (-gate[j], j))[: top_k - 1]
        read = [s for s in mine if s <= t and (block[s] == block[t] or block[s] in picked)]
        scores = k[b, read, h] @ q[b, t, h] / np.sqrt(q.shape[-1])
        w = np.exp(scores - scores.max())
        out[b, t, h] = (w / w.sum()) @ v[b, read, h]
  return out


def _qkv(seed=0, n=N, dtype=np.float64):
  rng = np.random.default_rng(seed)
  return tuple(rng.normal(size=(B, n, H, D)).astype(dtype) for _ in range(3))


def _ids():
  """Row 0: one document; row 1: left padding, a document, a document with a padding gap
  longer than a block inside it (an empty block), a third document, right padding."""
  ids = np.ones((B, N), np.int32)
  ids[1] = [0] * 3 + [1] * 7 + [2] * 3 + [0] * 6 + [2] * 5 + [3] * 3 + [0] * 2
  return ids


DOCUMENTS = [(3, 10), (10, 24), (24, 27)]  # row 1's documents, gaps included


@pytest.mark.parametrize('block_size, top_k', [(4, 2), (5, 3), (3, 1)])
def test_every_form_equals_the_float64_reference(x64, block_size, top_k):
  q, k, v = _qkv()
  ids = _ids()
  want = np_moba(q, k, v, ids, block_size, top_k)
  run = functools.partial(moba_attention, block_size=block_size, top_k=top_k, q_chunk=7, k_chunk=6)
  for form in moba_lib.FORMS:
    got = run(q, k, v, segment_ids=jnp.asarray(ids), form=form)
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=form)
  # The same selection from a key padding mask alone (row 1's documents then are one).
  one = (ids != 0).astype(np.int32)
  got = run(q, k, v, mask=jnp.asarray(ids != 0))
  np.testing.assert_allclose(got, np_moba(q, k, v, one, block_size, top_k), rtol=1e-10, atol=1e-12)


def test_every_form_has_the_dense_gradients(x64):
  q, k, v = _qkv(1)
  ids = jnp.asarray(_ids())
  ct = jnp.asarray(np.random.default_rng(2).normal(size=(B, N, H, D)))

  def loss(form, *qkv):
    out = moba.moba_attention(
      *qkv, block_size=4, top_k=2, form=form, q_chunk=8, k_chunk=6, segment_ids=ids
    )
    return jnp.sum(out * ct)

  grads = {
    f: jax.jit(jax.grad(functools.partial(loss, f), (0, 1, 2)))(q, k, v) for f in moba_lib.FORMS
  }
  for form in moba_lib.FORMS:
    for g, g_dense in zip(grads[form], grads['dense']):
      np.testing.assert_allclose(g, g_dense, rtol=1e-10, atol=1e-12, err_msg=form)
    assert not np.any(np.asarray(grads[form][1])[np.asarray(ids) == 0])  # padding: no gradient


def test_top_k_of_every_block_is_causal_softmax(x64):
  q, k, v = _qkv(3)
  want = softmax_attention(q, k, v, causal=True)
  for form in moba_lib.FORMS:
    got = moba_attention(q, k, v, block_size=4, top_k=8, form=form)  # 29 tokens: 8 blocks
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=form)
  sparse = moba_attention(q, k, v, block_size=4, top_k=7)
  assert not np.allclose(sparse, want)  # one block fewer is not (the test can fail)


@pytest.mark.parametrize('side', ['left', 'right'])
def test_padding_changes_no_real_output(side):
  """Blocks count from the first real token, padded keys (large garbage) are never read
  nor pooled: a padded row's real outputs are the unpadded row's; padded queries give 0."""
  q, k, v = _qkv(4, n=20, dtype=np.float32)
  pads = 7
  garbage = [100.0 * x for x in _qkv(5, n=pads, dtype=np.float32)]
  put = (
    (lambda g, x: np.concatenate([g, x], 1))
    if side == 'left'
    else (lambda g, x: np.concatenate([x, g], 1))
  )
  qp, kp, vp = (put(g, x) for g, x in zip(garbage, (q, k, v)))
  real = np.arange(20 + pads) >= pads if side == 'left' else np.arange(20 + pads) < 20
  mask = jnp.asarray(np.broadcast_to(real, (B, 20 + pads)))
  want = moba_attention(q, k, v, block_size=4, top_k=2)
  for form in moba_lib.FORMS:
    got = moba_attention(qp, kp, vp, mask=mask, block_size=4, top_k=2, form=form)
    np.testing.assert_allclose(got[:, real], want, rtol=1e-5, atol=1e-5, err_msg=form)
    assert not np.any(np.asarray(got[:, ~real]))


def test_a_packed_row_equals_its_documents_alone_with_gradients():
  """Row 1 of `_ids` against each document alone at the start of its own row (its gap and
  the rest of the row key padding): outputs and gradients of q, k, v; padding gets no
  gradient."""
  q, k, v = (x[1:] for x in _qkv(6, dtype=np.float32))
  ids = _ids()[1:]
  rng = np.random.default_rng(7)
  ct = rng.normal(size=q.shape).astype(np.float32) * (ids != 0)[..., None, None]
  alone = [
    10.0 * rng.normal(size=(len(DOCUMENTS),) + q.shape[1:]).astype(np.float32) for _ in range(4)
  ]
  real = np.zeros((len(DOCUMENTS), N), bool)
  for i, (a, b) in enumerate(DOCUMENTS):
    for x, y in zip(alone, (q, k, v, ct)):
      x[i, : b - a] = y[0, a:b]
    real[i, : b - a] = ids[0, a:b] != 0
  alone[3] *= real[..., None, None]

  def run(q, k, v, ct, **kw):
    out = moba.moba_attention(q, k, v, block_size=3, top_k=2, q_chunk=5, **kw)
    return jnp.sum(out * ct), out

  grad = jax.jit(jax.grad(run, (0, 1, 2), has_aux=True))
  packed = jax.tree.leaves(grad(q, k, v, ct, segment_ids=jnp.asarray(ids)))
  single = jax.tree.leaves(grad(*alone, mask=jnp.asarray(real)))
  for i, (a, b) in enumerate(DOCUMENTS):
    for x, y in zip(packed, single):
      np.testing.assert_allclose(x[0, a:b][real[i, : b - a]], y[i][real[i]], rtol=1e-5, atol=1e-5)
  for g in packed[:3]:
    assert not np.any(np.asarray(g)[:, ids[0] == 0])


def test_decoding_equals_the_parallel_pass():
  """Three hundred steps of a layer at width 8 (blocks of 16, top 3, tiles of 40 keys):
  each new token selects among the cached blocks as the parallel pass does."""
  n = 300
  x = jax.random.normal(jax.random.PRNGKey(0), (1, n, 8))
  layer = ea.MultiHeadAttention(
    num_heads=2,
    mechanism='moba',
    causal=True,
    options={'block_size': 16, 'top_k': 3, 'k_chunk': 40},
  )
  variables = layer.init(jax.random.PRNGKey(1), x)
  want = layer.apply(variables, x)
  dec = layer.clone(decode=True)
  _, cache = dec.apply(variables, x, mutable=['cache'])

  def body(cache, xt):
    y, cache = dec.apply({**variables, **cache}, xt[None, None], mutable=['cache'])
    return cache, y[0, 0]

  _, got = jax.lax.scan(body, cache, x[0])
  np.testing.assert_allclose(got, want[0], rtol=2e-5, atol=2e-5)


def test_bfloat16_is_float32_of_the_rounded_inputs():
  """bfloat16 inputs (large): the gate and softmax run in float32, so the output is the
  float32 output of the same (rounded) inputs, up to its final rounding; gradients finite."""
  q, k, v = (jnp.asarray(30.0 * x, jnp.bfloat16) for x in _qkv(8, dtype=np.float32))
  got = moba_attention(q, k, v, block_size=4, top_k=2)
  want = moba_attention(*(x.astype(jnp.float32) for x in (q, k, v)), block_size=4, top_k=2)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-2, atol=1e-2 * 30)
  grads = jax.jit(
    jax.grad(
      lambda q, k, v: jnp.sum(
        moba.moba_attention(q, k, v, block_size=4, top_k=2).astype(jnp.float32)
      ),
      (0, 1, 2),
    )
  )(q, k, v)
  assert all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)


def test_select_blocks_forces_the_own_block_and_never_the_future():
  scores = jnp.asarray([[5.0, 1.0, 1.0, 0.5, 7.0, 8.0]])
  index, valid = moba_blocks.select_blocks(scores, jnp.asarray([4]), 3)
  assert index.tolist() == [[4, 0, 1]] and valid.all()  # 1 before 2 (a tie), never 5
  available = jnp.asarray([[False, True, True, True, True, True]])
  index, valid = moba_blocks.select_blocks(scores, jnp.asarray([2]), 4, available)
  assert index[0, :2].tolist() == [2, 1] and valid.tolist() == [[True, True, False, False]]
  assert moba_blocks.select_blocks(scores, jnp.asarray([3]), 1)[0].tolist() == [[3]]


def test_bad_calls_are_one_line():
  q, k, v = _qkv(dtype=np.float32)
  cases = [
    (dict(causal=False), 'moba_attention: causal=False is not valid; MoBA is causal only'),
    (dict(form='fast'), "moba_attention: form='fast' is not valid"),
    (dict(top_k=0), 'moba_attention: top_k=0 is not valid'),
  ]
  for kw, message in cases:
    with pytest.raises(ValueError) as e:
      moba.moba_attention(q, k, v, **kw)
    assert str(e.value).startswith(message) and '\n' not in str(e.value), e.value
  with pytest.raises(ValueError, match="'moba' is causal only"):
    ea.MultiHeadAttention(num_heads=2, mechanism='moba').init(jax.random.PRNGKey(0), q[..., 0, :])

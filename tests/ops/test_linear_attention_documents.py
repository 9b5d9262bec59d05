"""Packed rows (`segment_ids`) in kernel attention (`efficient_attn.ops.linear_attention`,
and the pure functions of linear attention, RFA and Performer): a packed row equals each of
its documents run alone, outputs, final state and gradients, in float32 against float64;
NaN in the padding reaches nothing; what cannot be honoured is refused in one line.

The rows are tests/ops/test_documents.py's (13 tokens, chunks of 4): a document of one
token, documents across a chunk boundary, a padding gap inside a document, an id reused
later, leading and trailing padding.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_documents import packed_ids

from efficient_attn.mechanisms.linear import linear_attention
from efficient_attn.mechanisms.performer import performer_attention
from efficient_attn.mechanisms.rfa import rfa_attention
from efficient_attn.ops import linear_attention as la
from efficient_attn.ops import segments

B, N, H, F, DV, CHUNK = 2, 13, 2, 3, 4, 4
IDS = packed_ids()


def documents(ids):
  """[(row, token positions)] of each document of the packed rows `ids` (a padding gap
  inside a document is not one of its tokens; key padding there in the row alone is the
  same as none, for these forms, which read no positions)."""
  docs = np.asarray(segments.document_index(ids))
  return [
    (r, np.where((docs[r] == d) & (ids[r] != 0))[0])
    for r in range(len(ids))
    for d in sorted(set(docs[r][ids[r] != 0]))
  ]


DOCUMENTS = documents(IDS)
# The documents alone: one row each, its tokens first, key padding after them.
ALONE_REAL = np.zeros((len(DOCUMENTS), N), bool)
SOURCE_ROW, SOURCE_POSITION = np.zeros((2, len(DOCUMENTS), N), int)
for _j, (_r, _at) in enumerate(DOCUMENTS):
  ALONE_REAL[_j, : _at.size], SOURCE_ROW[_j], SOURCE_POSITION[_j, : _at.size] = True, _r, _at


def packed_against_alone(run, inputs):
  """(packed, alone): `run(*inputs, segment_ids, key_padding)` on the packed rows in
  float32, with NaN at the padding, and on the documents alone (one row each, key padding
  after it) in float64, put back in the packed layout (0 at padding); each as (output,
  gradients of sum(output * cotangent))."""
  cotangent = np.random.default_rng(9).standard_normal((B, N, H, DV)) * (IDS != 0)[..., None, None]
  with_nan = [np.where((IDS != 0).reshape((B, N) + (1,) * (x.ndim - 2)), x, np.nan) for x in inputs]

  # The cotangent is an argument: a NumPy constant closed over by both programs would be
  # converted once, in the first one's float width.
  def packed(cotangent, *xs):
    ids = jnp.asarray(IDS)
    loss = lambda *xs: jnp.sum(run(*xs, ids, None) * cotangent)
    return run(*xs, ids, None), jax.grad(loss, range(len(xs)))(*xs)

  def alone(cotangent, *xs):
    def outputs(*xs):
      real = lambda x: ALONE_REAL.reshape(ALONE_REAL.shape + (1,) * (x.ndim - 2))
      rows = [jnp.where(real(x), x[SOURCE_ROW, SOURCE_POSITION], 0) for x in xs]
      out = run(*rows, None, jnp.asarray(ALONE_REAL))
      out = jnp.where(real(out), out, 0)
      return jnp.zeros((B, N, H, DV), out.dtype).at[SOURCE_ROW, SOURCE_POSITION].add(out)

    loss = lambda *xs: jnp.sum(outputs(*xs) * cotangent)
    return outputs(*xs), jax.grad(loss, range(len(xs)))(*xs)

  got = jax.jit(packed)(*(jnp.asarray(x, jnp.float32) for x in [cotangent, *with_nan]))
  with jax.enable_x64(True):
    want = jax.jit(alone)(*(jnp.asarray(x, jnp.float64) for x in [cotangent, *inputs]))
    want = jax.tree.map(np.asarray, want)
  return jax.tree.map(np.asarray, got), want


def assert_matches(got, want, name):
  (out, grads), (want_out, want_grads) = got, want
  np.testing.assert_allclose(out, want_out, atol=1e-5, rtol=1e-5, err_msg=name)
  assert not out[IDS == 0].any(), name
  for i, (g, w) in enumerate(zip(grads, want_grads)):
    assert not g[IDS == 0].any(), (name, i)  # NaN padding: no gradient, no NaN
    scale = max(1.0, float(np.abs(w).max()))
    np.testing.assert_allclose(g, w, atol=1e-5 * scale, rtol=1e-4, err_msg=f'{name} grad {i}')


def _kernel_inputs(numerator: bool, gate: bool):
  rng = np.random.default_rng(0)
  xs = [np.abs(rng.standard_normal((B, N, H, F))) + 0.1 for _ in range(2)]  # phi_q, phi_k
  if numerator:
    xs += [rng.standard_normal((B, N, H, F)) for _ in range(2)]
  xs.append(rng.standard_normal((B, N, H, DV)))
  if gate:
    xs.append(rng.uniform(0.2, 0.9, (B, N, H)))
  return xs


@pytest.mark.parametrize(
  'causal, numerator, gate',
  [(True, False, False), (True, True, True), (False, False, False), (False, True, False)],
  ids=['causal', 'causal-numerator-gate', 'bidirectional', 'bidirectional-numerator'],
)
def test_kernel_attention_on_a_packed_row_equals_its_documents_alone(causal, numerator, gate):
  """Outputs and the gradients of every input; and (causal) the final state is the last
  document's, as decoding from it would need."""

  def run(*xs):
    *xs, ids, key_padding = xs
    g = xs.pop() if gate else None
    features = la.KernelFeatures(*xs[:4]) if numerator else la.KernelFeatures(*xs[:2])
    out, _ = la.kernel_attention(
      features,
      xs[-1],
      key_padding=key_padding,
      causal=causal,
      gate=g,
      segment_ids=ids,
      chunk_size=CHUNK,
    )
    return out

  name = f'causal={causal} numerator={numerator} gate={gate}'
  assert_matches(*packed_against_alone(run, _kernel_inputs(numerator, gate)), name)


def test_the_final_state_is_the_last_documents():
  xs = _kernel_inputs(False, False)
  features, v = la.KernelFeatures(*map(jnp.asarray, xs[:2])), jnp.asarray(xs[2])
  _, state = jax.jit(
    lambda f, v: la.kernel_attention(f, v, causal=True, segment_ids=IDS, chunk_size=CHUNK)
  )(features, v)
  for r in range(B):
    _, at = [d for d in DOCUMENTS if d[0] == r][-1]
    last = la.KernelFeatures(features.phi_q[r : r + 1, at], features.phi_k[r : r + 1, at])
    _, want = la.kernel_attention(last, v[r : r + 1, at], causal=True, chunk_size=CHUNK)
    np.testing.assert_allclose(state.s[r], want.s[0], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(state.z[r], want.z[0], atol=1e-5, rtol=1e-5)


PROJECTION = np.random.default_rng(3).standard_normal((6, F))
PURE = {
  'linear': lambda q, k, v, causal, **kw: linear_attention(
    q, k, v, causal=causal, chunk_size=CHUNK, **kw
  ),
  'rfa': lambda q, k, v, causal, **kw: rfa_attention(
    q, k, v, jnp.asarray(PROJECTION, q.dtype), causal=causal, chunk_size=CHUNK, **kw
  ),
  # Its key stabiliser is one per document (each run alone has its own).
  'performer': lambda q, k, v, causal, **kw: performer_attention(
    q, k, v, jnp.asarray(PROJECTION, q.dtype), causal=causal, chunk_size=CHUNK, **kw
  ),
}


@pytest.mark.parametrize('causal', [True, False], ids=['causal', 'bidirectional'])
@pytest.mark.parametrize('name', sorted(PURE))
def test_the_pure_functions_on_a_packed_row_equal_their_documents_alone(name, causal):
  """Two heads (folded into the batch, one row at a time for Performer on CPU)."""
  rng = np.random.default_rng(1)
  inputs = [rng.standard_normal((B, N, H, F)) for _ in range(2)] + [
    rng.standard_normal((B, N, H, DV))
  ]
  run = lambda q, k, v, ids, mask: PURE[name](q, k, v, causal, segment_ids=ids, mask=mask)
  assert_matches(*packed_against_alone(run, inputs), f'{name} causal={causal}')


def test_what_packed_rows_cannot_do_is_refused_in_one_line():
  xs = _kernel_inputs(False, False)
  features, v = la.KernelFeatures(*map(jnp.asarray, xs[:2])), jnp.asarray(xs[2])
  with pytest.raises(ValueError, match=r"not split over sequence_axis='s'; valid: causal=True"):
    la.kernel_attention(features, v, causal=False, segment_ids=IDS, sequence_axis='s')
  q = jnp.zeros((B, N, H, F))
  with pytest.raises(ValueError, match='Performer attention takes segment_ids on one device'):
    performer_attention(q, q, q, jnp.asarray(PROJECTION), segment_ids=IDS, sequence_axis='s')
  short = la.KernelFeatures(features.phi_q[:, :5], features.phi_k)
  with pytest.raises(ValueError, match='is self-attention: q_length 5 != kv_length 13'):
    la.kernel_attention(short, v, segment_ids=IDS)
  with pytest.raises(ValueError, match='kernel attention') as error:
    la.kernel_attention(features, v, segment_ids=IDS[:, :5])
  assert '\n' not in str(error.value)

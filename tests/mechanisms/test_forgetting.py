"""Forgetting Attention (Lin et al. 2025): the chunked and dense forms against a float64
reference written out here, padding, packed rows, decoding, bfloat16 and f = 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn import mechanisms
from efficient_attn import registry
from efficient_attn.ops import forget_bias

B, N, H, D = 2, 21, 2, 4  # several blocks of the chunks below, and a ragged last one
CHUNKS = {'q_chunk': 8, 'k_chunk': 4}


def _inputs(seed=0, n=N, dtype=jnp.float64, strength=1.0):
  rng = np.random.RandomState(seed)
  q, k, v = (rng.randn(B, n, H, D) for _ in range(3))
  log_f = -np.logaddexp(0.0, -(rng.randn(B, n, H) * 2 + 1)) * strength  # log_sigmoid
  return tuple(jnp.asarray(x, dtype) for x in (q, k, v, log_f))


def reference(q, k, v, log_f, real=None, ids=None):
  """o_i = sum_{j <= i} softmax_j(q_i . k_j / sqrt(d) + sum_{j < l <= i} log f_l) v_j over the
  real keys of i's document, token by token in float64 (0 at padded queries)."""
  q, k, v, log_f = (np.asarray(x, np.float64) for x in (q, k, v, log_f))
  b, n, h, d = q.shape
  real = np.ones((b, n), bool) if real is None else np.asarray(real)
  ids = np.ones((b, n), int) if ids is None else np.asarray(ids)
  out = np.zeros(q.shape[:3] + v.shape[3:])
  for r in range(b):
    doc, last, docs = -1, None, []
    for t in range(n):  # documents: runs of equal ids among the real tokens
      if real[r, t] and ids[r, t] != last:
        doc, last = doc + 1, ids[r, t]
      docs.append(doc)
    total = np.cumsum(np.where(real[r, :, None], log_f[r], 0.0), 0)  # F [n, h]
    for i in range(n):
      if not real[r, i]:
        continue
      keys = [j for j in range(i + 1) if real[r, j] and docs[j] == docs[i]]
      for head in range(h):
        decay = total[i, head] - total[keys, head]  # the real tokens' log f in (j, i]
        s = np.array([q[r, i, head] @ k[r, j, head] / np.sqrt(d) for j in keys]) + decay
        w = np.exp(s - s.max())
        out[r, i, head] = (w / w.sum()) @ v[r, keys, head]
  return out


@pytest.fixture(scope='module')
def attend():
  """The pure function, compiled once per (form, argument shape)."""
  return jax.jit(
    lambda q, k, v, log_f, mask, ids, form: mechanisms.forgetting_attention(
      q, k, v, log_f, mask, form=form, segment_ids=ids, **CHUNKS
    ),
    static_argnames='form',
  )


PADDING = {
  'none': np.ones((B, N), bool),
  'left': np.arange(N)[None] >= np.array([[5], [0]]),
  'right': np.arange(N)[None] < np.array([[N], [13]]),
}


@pytest.mark.parametrize('form', ('chunked', 'dense'))
@pytest.mark.parametrize('padding', tuple(PADDING))
def test_forms_equal_the_float64_reference(x64, attend, form, padding):
  q, k, v, log_f = _inputs()
  real = PADDING[padding]
  out = attend(q, k, v, log_f, jnp.asarray(real), None, form=form)
  np.testing.assert_allclose(out, reference(q, k, v, log_f, real), atol=1e-12)


def test_chunked_gradients_equal_the_dense_ones(x64):
  """Every input's gradient, the forget gates' too (through the flash bias's row and
  column sums), with padding and packed documents."""
  q, k, v, log_f = _inputs(1)
  ids = jnp.asarray(np.repeat([[1, 2, 0, 3], [4, 4, 5, 0]], [6, 6, 3, 6], axis=1))
  mask = jnp.asarray(PADDING['left'])

  @jax.jit
  def grads(q, k, v, log_f):
    def one(form):
      loss = lambda *x: jnp.sum(
        mechanisms.forgetting_attention(*x, mask, form=form, segment_ids=ids, **CHUNKS) ** 2
      )
      return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, log_f)

    return one('dense'), one('chunked')

  dense, chunked = grads(q, k, v, log_f)
  for want, got in zip(dense, chunked):
    np.testing.assert_allclose(got, want, atol=1e-12)
  assert float(jnp.abs(chunked[3]).max()) > 1e-3  # the gates do get a gradient


@jax.jit
def _with_gradients(q, k, v, log_f, ids=None):
  """(out, the gradients of sum(sin(out)) in q, k, v, log f) of the chunked form."""
  fn = lambda *x: mechanisms.forgetting_attention(*x, segment_ids=ids, **CHUNKS)
  out, vjp = jax.vjp(fn, q, k, v, log_f)
  return out, vjp(jnp.cos(out))


def test_packed_row_equals_each_document_alone(x64):
  """Outputs and gradients: documents of 9 and 12 tokens; in the second row padding
  inside a document and after the last."""
  q, k, v, log_f = _inputs(2)
  ids = np.array([[1] * 9 + [2] * 12, [3] * 4 + [0] * 2 + [3] * 3 + [7] * 10 + [0] * 2])
  packed, grads = _with_gradients(q, k, v, log_f, jnp.asarray(ids))
  np.testing.assert_allclose(packed, reference(q, k, v, log_f, ids != 0, ids), atol=1e-12)
  row = 0  # its documents alone: tokens 0..8 and 9..20
  for lo, hi in ((0, 9), (9, N)):
    alone, grads_alone = _with_gradients(*(x[row : row + 1, lo:hi] for x in (q, k, v, log_f)))
    np.testing.assert_allclose(packed[row, lo:hi], alone[0], atol=1e-12)
    for g, g_alone in zip(grads, grads_alone):
      np.testing.assert_allclose(g[row, lo:hi], g_alone[0], atol=1e-12)


def test_no_forgetting_is_causal_softmax_exactly():
  """f = 1 (log f = 0): the bias is 0 and every score is softmax's, bit for bit."""
  q, k, v, _ = _inputs(3, dtype=jnp.float32)
  mask = jnp.asarray(PADDING['right'])
  out, want = jax.jit(
    lambda q, k, v: (
      mechanisms.forgetting_attention(q, k, v, jnp.zeros(q.shape[:3]), mask, **CHUNKS),
      mechanisms.chunked_softmax_attention(q, k, v, mask, causal=True, **CHUNKS),
    )
  )(q, k, v)
  np.testing.assert_array_equal(out, want * mask[..., None, None])


def test_bfloat16_is_stable_under_strong_forgetting(x64):
  """bfloat16 inputs over 96 tokens whose gates sum to F ~ -150 to -220 (bfloat16 itself
  would hold -220 to within 1): F stays float32, the output finite and near the float64
  reference."""
  q, k, v, log_f = _inputs(4, n=96, strength=3.0)
  assert float(jnp.sum(log_f, 1).min()) < -200
  low = mechanisms.forgetting_attention(
    *(x.astype(jnp.bfloat16) for x in (q, k, v)), log_f.astype(jnp.bfloat16), q_chunk=32, k_chunk=16
  )
  assert low.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(low)))
  log_f = log_f.astype(jnp.bfloat16).astype(jnp.float64)  # the gates as bfloat16 holds them
  want = reference(*(x.astype(jnp.bfloat16).astype(jnp.float64) for x in (q, k, v)), log_f)
  np.testing.assert_allclose(np.asarray(low, np.float64), want, atol=0.05)


def test_decoding_equals_the_parallel_form():
  """A prompt of 40 tokens in one call, then 160 steps, with a packed stream (new documents
  and padding), against the parallel form over the whole row."""
  n, prompt = 200, 40
  q, k, v, log_f = _inputs(5, n=n, dtype=jnp.float32)
  ids = np.ones((B, n), np.int32)
  ids[0, 70:] = 2
  ids[0, 90:95] = 0
  ids[1, 150:] = 3
  scale = 1 / np.sqrt(D)

  @jax.jit
  def decoded(q, k, v, log_f, ids):
    cache = forget_bias.init_cache(B, n, H, D, D)
    cache, first = forget_bias.decode(
      cache, *(x[:, :prompt] for x in (q, k, v, log_f)), scale=scale, segment_ids=ids[:, :prompt]
    )

    def step(cache, token):
      return forget_bias.decode(cache, *token[:4], scale=scale, segment_ids=token[4])

    tokens = tuple(jnp.moveaxis(x[:, prompt:, None], 1, 0) for x in (q, k, v, log_f, ids))
    cache, rest = jax.lax.scan(step, cache, tokens)
    return cache, jnp.concatenate([first, jnp.moveaxis(rest[:, :, 0], 0, 1)], 1)

  cache, decoded = decoded(q, k, v, log_f, jnp.asarray(ids))
  parallel = mechanisms.forgetting_attention(
    q, k, v, log_f, segment_ids=ids, q_chunk=32, k_chunk=32
  )
  np.testing.assert_allclose(decoded, parallel, atol=2e-5)
  assert int(cache.filled) == n
  with pytest.raises(ValueError, match='past the cache capacity'):
    forget_bias.decode(cache, *(x[:, :1] for x in (q, k, v, log_f)), scale=scale)


def test_refusals_name_the_value():
  q, k, v, log_f = _inputs(dtype=jnp.float32)
  with pytest.raises(ValueError, match=r'log_forget of shape \(2, 21\).*\[2, 21, 2\]'):
    mechanisms.forgetting_attention(q, k, v, log_f[..., 0])
  with pytest.raises(ValueError, match="form='naive'.*'chunked', 'dense'"):
    mechanisms.forgetting_attention(q, k, v, log_f, form='naive')
  with pytest.raises(ValueError, match='causal only'):
    registry.configure('forgetting', causal=False)
  decl = registry.get_mechanism('forgetting')
  with pytest.raises(ValueError, match='needs capacity'):
    decl.init_state(decl.resolve(), batch=1, heads=1, head_dim=2, v_dim=2)


def test_the_output_gate_multiplies_the_parallel_and_the_decoding_forms():
  """output_gate=True (the Pro block's o * sigmoid(x W_g), fla's use_output_gate): its
  projection is declared, and attend and a prefill from the empty cache both apply it."""
  decl = registry.get_mechanism('forgetting')
  gated, plain = decl.resolve({'output_gate': True, **CHUNKS}), decl.resolve(CHUNKS)
  assert decl.input_params(gated, features=8, heads=H, head_dim=D)['gate_kernel'].shape == (8, H, D)
  assert 'gate_kernel' not in decl.input_params(plain, features=8, heads=H, head_dim=D)
  q, k, v, log_f = _inputs(6, dtype=jnp.float32)
  logits = jax.random.normal(jax.random.PRNGKey(0), v.shape)

  @jax.jit
  def forms(q, k, v, log_f, logits):
    ctx = registry.Context()
    ctx.gates = {'log_forget': log_f, 'output': logits}
    out = decl.attend(gated, {}, q, k, v, mask=None, causal=True, ctx=ctx)
    ungated = decl.attend(plain, {}, q, k, v, mask=None, causal=True, ctx=ctx)
    state = decl.init_state(gated, batch=B, heads=H, head_dim=D, v_dim=D, capacity=N)
    return out, ungated, decl.prefill(gated, {}, state, q, k, v, ctx=ctx)[1]

  out, ungated, decoded = forms(q, k, v, log_f, logits)
  np.testing.assert_allclose(out, ungated * jax.nn.sigmoid(logits), rtol=1e-6)
  np.testing.assert_allclose(decoded, out, atol=1e-5)

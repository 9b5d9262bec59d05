"""The diagonal-plus-low-rank recurrence (efficient_attn.ops.dplr): its token scan and
decoding step equal a NumPy loop over dense transitions, its chunkwise WY form equals the
scan in float64 over several chunks (with and without sub-chunks, a decay per feature that
is strong in one head, per head, none), gradients included; with a = -k, b = beta k it is
the delta rule; a packed row equals each document alone (initial state into the first,
final state from the last); bfloat16 inputs stay finite and close over 1K tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn.ops import delta
from efficient_attn.ops import dplr
from efficient_attn.ops import segments

B, H, DK, DV = 2, 2, 5, 3


def _inputs(n, seed=0, decay='feature', b=B, h=H, dk=DK, dv=DV):
  """float64 NumPy inputs as RWKV-7 makes them (a = -kappa, b = alpha kappa, kappa
  unit); head 1 decays strongly (log-decays down to -30 a token)."""
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((b, n, h, dk)) for _ in range(2))
  v = rng.standard_normal((b, n, h, dv))
  kappa = rng.standard_normal((b, n, h, dk))
  kappa /= np.linalg.norm(kappa, axis=-1, keepdims=True)
  rate = rng.uniform(0.0, 1.0, (b, n, h, dk))
  ab = np.stack([-kappa, rate * kappa], axis=3)
  width = {'feature': dk, 'head': 1, None: 1}[decay]
  g = -np.array([1.0, 30.0])[:h, None] * rng.uniform(0.0, 1.0, (b, n, h, width))
  state = 0.5 * rng.standard_normal((b, h, dk, dv))
  return q, k, v, (None if decay is None else g), ab, state


def _numpy_reference(q, k, v, g, ab, state):
  """S_t = (diag(exp(g_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, with dense
  transitions: (out, final state)."""
  b, n, h, dk = q.shape
  s, out = np.array(state), np.zeros(v.shape)
  for t in range(n):
    decay = np.ones((b, h, dk)) if g is None else np.broadcast_to(np.exp(g[:, t]), (b, h, dk))
    m = np.einsum('bhi,ij->bhij', decay, np.eye(dk)) + np.einsum(
      'bhi,bhj->bhij', ab[:, t, :, 1], ab[:, t, :, 0]
    )
    s = m @ s + np.einsum('bhk,bhv->bhkv', k[:, t], v[:, t])
    out[:, t] = np.einsum('bhk,bhkv->bhv', q[:, t], s)
  return out, s


@pytest.mark.parametrize('decay', ['feature', 'head', None])
def test_the_scan_and_the_step_equal_the_dense_recurrence(decay):
  q, k, v, g, ab, state = _inputs(11, decay=decay)
  want, want_state = _numpy_reference(q, k, v, g, ab, state)
  with jax.enable_x64(True):
    args = [None if a is None else jnp.asarray(a) for a in (q, k, v, g, ab)]
    out, s = jax.jit(dplr.dplr_scan)(*args, initial_state=jnp.asarray(state))
    np.testing.assert_allclose(out, want, atol=1e-12, rtol=1e-10)
    np.testing.assert_allclose(s, want_state, atol=1e-12, rtol=1e-10)
    s, outs, step = jnp.asarray(state), [], jax.jit(dplr.dplr_step)
    for t in range(q.shape[1]):
      s, o = step(s, *(None if a is None else a[:, t] for a in args))
      outs.append(o)
    np.testing.assert_allclose(jnp.stack(outs, 1), want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize('decay, chunk, sub', [('feature', 8, 4), ('head', 5, 4), (None, 8, 8)])
def test_the_chunk_form_equals_the_scan_in_float64(decay, chunk, sub):
  """37 tokens: several chunks, the last one short; sub-chunks split at their ends (8 / 4)
  or one sub-chunk (5 / 4, which 4 does not divide; 8 / 8); outputs, final state and the
  gradients of every input."""
  q, k, v, g, ab, state = _inputs(37, decay=decay)
  with jax.enable_x64(True):
    args = tuple(None if a is None else jnp.asarray(a) for a in (q, k, v, g, ab, state))
    argnums = tuple(i for i, a in enumerate(args) if a is not None)

    def run(form, *a):
      out, s = form(*a[:5], initial_state=a[5])
      return jnp.sum(jnp.sin(out)) + jnp.sum(jnp.cos(s)), (out, s)

    chunked = lambda *a, **kw: dplr.dplr_chunked(*a, chunk_size=chunk, sub_chunk=sub, **kw)
    grad = lambda form: jax.grad(lambda *a: run(form, *a), argnums=argnums, has_aux=True)
    want_grads, want = grad(dplr.dplr_scan)(*args)
    got_grads, got = jax.jit(grad(chunked))(*args)
    assert bool(jnp.all(jnp.isfinite(got[0])))
    for name, x, y in zip(('out', 'state'), got, want):
      np.testing.assert_allclose(x, y, atol=1e-10, rtol=1e-9, err_msg=name)
    for i, x, y in zip(argnums, got_grads, want_grads):
      np.testing.assert_allclose(x, y, atol=1e-9, rtol=1e-8, err_msg=f'gradient {i}')


def test_with_a_rank_one_erase_it_is_the_delta_rule():
  """a = -k, b = beta k and a decay per head: (a_t (I - beta_t k_t k_t^T)) S + k_t v_t^T
  needs the decay on the low-rank term too, so the DPLR pair is b = beta exp(g) k; the
  delta rule's write is then k~ = beta k."""
  q, k, v, g, _, state = _inputs(21, decay='head')
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  beta = np.random.default_rng(3).uniform(0.0, 1.0, k.shape[:3])
  ab = np.stack([-k, beta[..., None] * np.exp(g) * k], axis=3)
  with jax.enable_x64(True):
    f64 = lambda a: jnp.asarray(a)
    want, want_state = jax.jit(delta.delta_scan)(
      *map(f64, (q, k, v, g, beta)), initial_state=f64(state)
    )
    write = beta[..., None] * k
    got, s = jax.jit(lambda *a, **kw: dplr.dplr_chunked(*a, chunk_size=8, **kw))(
      *map(f64, (q, write, v, g, ab)), initial_state=f64(state)
    )
  np.testing.assert_allclose(got, want, atol=1e-10, rtol=1e-9)
  np.testing.assert_allclose(s, want_state, atol=1e-10, rtol=1e-9)


def test_a_packed_row_equals_each_document_alone():
  """Documents of 1, 9 (across a chunk boundary), 12 tokens and a reused id, padding in
  front, inside a document and after; the initial state reaches the row's first document
  only, and the final state is the last document's, in both forms."""
  ids = np.array(
    [[0, 0, 4, 4, 4, 7, 2, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 0, 4, 4, 4, 0, 0],
     [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]
  )  # fmt: skip
  n = ids.shape[1]
  docs = np.asarray(segments.document_index(jnp.asarray(ids)))
  q, k, v, g, ab, state = _inputs(n, seed=1)
  with jax.enable_x64(True):
    args = [jnp.asarray(a) for a in (q, k, v, g, ab)]
    # every document alone, left-aligned in its own row (trailing padding), in one call
    rows = [
      (row, d, np.flatnonzero((docs[row] == d) & (ids[row] != 0)))
      for row in range(B)
      for d in sorted(set(docs[row]))
    ]
    take = np.zeros((len(rows), n), int)
    real = np.zeros((len(rows), n), bool)
    for j, (_, _, at) in enumerate(rows):
      take[j, : at.size], real[j, : at.size] = at, True
    gather = lambda a: a[np.array([row for row, _, _ in rows])[:, None], take]
    init = np.stack([state[row] if d == 0 else np.zeros_like(state[row]) for row, d, _ in rows])
    alone, s_alone = map(
      np.asarray,
      jax.jit(dplr.dplr_scan)(
        *map(gather, args), initial_state=jnp.asarray(init), segment_ids=jnp.asarray(real, int)
      ),
    )
    last = [max(j for j, (r, _, _) in enumerate(rows) if r == row) for row in range(B)]
    forms = {
      'scan': dplr.dplr_scan,
      'chunk': lambda *a, **kw: dplr.dplr_chunked(*a, chunk_size=4, **kw),
    }
    for name, form in forms.items():
      out, s = map(
        np.asarray,
        jax.jit(form)(*args, initial_state=jnp.asarray(state), segment_ids=jnp.asarray(ids)),
      )
      for j, (row, d, at) in enumerate(rows):
        np.testing.assert_allclose(
          out[row, at], alone[j, : at.size], atol=1e-11, err_msg=f'{name} {row} {d}'
        )
      np.testing.assert_allclose(s, s_alone[np.array(last)], atol=1e-11, err_msg=f'{name} state')
      assert not out[ids == 0].any()


def test_bfloat16_inputs_stay_finite_and_close_over_1k_tokens():
  """bfloat16 q, k, v, low-rank pairs and decays (float32 state and scores): within 2e-2 of
  the float64 scan relative to the output's scale, over 1024 tokens."""
  q, k, v, g, ab, state = _inputs(1024, seed=2, h=1, dk=8, dv=8)
  g = g / 30.0  # RWKV-7's decays, log w in (-0.61, 0)
  with jax.enable_x64(True):
    want, _ = dplr.dplr_scan(*(jnp.asarray(a) for a in (q, k, v, g, ab)))
  bf16 = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v, g, ab)]
  got, s = jax.jit(lambda *a: dplr.dplr_chunked(*a, chunk_size=64))(*bf16)
  assert got.dtype == jnp.float32 and s.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(got)))
  error = float(jnp.max(jnp.abs(got - np.asarray(want))) / np.abs(np.asarray(want)).max())
  assert error < 2e-2, error

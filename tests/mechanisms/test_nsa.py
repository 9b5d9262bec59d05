"""Native Sparse Attention (Yuan et al. 2025): the blocked form equals its dense n x n
reference and a float64 reference written token by token here, branch by branch, with
padding and packed rows; each branch alone is the attention it names; bfloat16 is stable.

The registry-wide tests (tests/layers/) cover the layer: no look-ahead, padding, packed
rows through the layer (outputs and gradients), Linen = NNX, the projections.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn.mechanisms import nsa
from efficient_attn.mechanisms.local import local_attention
from efficient_attn.ops.scaled_dot_product import softmax_attention

B, N, H, DIM = 2, 40, 2, 8
# (l, d, l', n, w): l = l' = 2d as fla; then l' != l, with ten and five selection blocks.
SIZES = {
  'same': dict(compress_block=4, compress_stride=2, select_block=4, num_selected=4, window=5),
  'mixed': dict(compress_block=6, compress_stride=2, select_block=8, num_selected=3, window=3),
}
IDS = {
  'one': None,
  'right': np.array([[1] * N, [1] * (N - 11) + [0] * 11]),
  'left': np.array([[0] * 7 + [1] * (N - 7), [1] * N]),
  'packed': np.array(
    [[1] * 9 + [2] * 17 + [0] * 2 + [2] * 3 + [3] * 6 + [0] * 3, [0] * 2 + [3] * 1 + [1] * 37]
  ),
}


def _inputs(seed=0, dtype=jnp.float64, sizes=SIZES['same']):
  keys = jax.random.split(jax.random.PRNGKey(seed), 10)
  q, k, v = (jax.random.normal(keys[i], (B, N, H, DIM), dtype) for i in range(3))
  gates = jax.random.uniform(keys[3], (B, N, H, 3), dtype)
  decl = ea.get_mechanism('nsa')
  specs = decl.params(decl.resolve(sizes), heads=H, head_dim=DIM, max_length=None, causal=True)
  params = {
    name: 0.3 * jax.random.normal(keys[4 + i], spec.shape, dtype)
    for i, (name, spec) in enumerate(sorted(specs.items()))
  }
  return q, k, v, gates, params


@functools.partial(jax.jit, static_argnames=('form', 'sizes'))
def _nsa(q, k, v, gates, params, ids, *, form, sizes):
  return nsa.nsa_attention(
    q, k, v, gates, params, segment_ids=ids, form=form, query_block=8, **dict(sizes)
  )


def _run(q, k, v, gates, params, ids, form, sizes):
  ids = jnp.ones((B, N), jnp.int32) if ids is None else jnp.asarray(ids, jnp.int32)
  return _nsa(q, k, v, gates, params, ids, form=form, sizes=tuple(sorted(sizes.items())))


def _phi(x, w_in, w_out, position):
  """The paper's phi on one block `[l, dim]`: mean + W_out silu(flatten(x + p) W_in)."""
  l, dim, hidden = w_in.shape
  inner = (x + position).reshape(-1) @ w_in.reshape(l * dim, hidden)
  return x.mean(0) + (inner / (1 + np.exp(-inner))) @ w_out


def _softmax_read(q, keys, values):
  if not len(keys):
    return np.zeros(values.shape[-1] if values.ndim == 2 else q.shape[-1])
  s = np.array(keys) @ q
  w = np.exp(s - s.max())
  return (w / w.sum()) @ np.array(values)


def _plain(q, k, v, gates, params, ids, l, d, sel, n_sel, w):
  """Token by token, float64: each real token's document from the ids (a run of equal
  non-zero ids), its blocks counted from the document's first token."""
  q, k, v, gates = (np.asarray(x, np.float64) for x in (q, k, v, gates))
  p = {name: np.asarray(x, np.float64) for name, x in params.items()}
  ids = np.ones((B, N), int) if ids is None else np.asarray(ids)
  out = np.zeros(v.shape)
  scale = DIM**-0.5
  for b in range(B):
    start, last = 0, 0
    for t in range(N):
      if ids[b, t] == 0:
        continue
      if ids[b, t] != last:
        start, last = t, ids[b, t]
      real = lambda s: s >= start and ids[b, s] != 0
      for h in range(H):
        qt = q[b, t, h] * scale
        slots = []  # (j, compressed key, compressed value) of blocks ending at or before t
        j = 0
        while start + j * d + l - 1 <= t:
          rows = range(start + j * d, start + j * d + l)
          if all(real(s) for s in rows):
            ck = _phi(k[b, rows, h], p['key_compress_in'], p['key_compress_out'], p['key_position'])
            cv = _phi(
              v[b, rows, h], p['value_compress_in'], p['value_compress_out'], p['value_position']
            )
            slots.append((j, ck, cv))
          j += 1
        o_cmp = _softmax_read(
          qt, [c[1] for c in slots], np.array([c[2] for c in slots]).reshape(-1, DIM)
        )
        if slots:
          s = np.array([c[1] for c in slots]) @ qt
          prob = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        current = (t - start) // sel
        scores = []
        for i in range(current + 1):
          if i in (0, current, current - 1):
            score = np.inf
          else:
            score = sum(
              prob[m]
              for m, (j, _, _) in enumerate(slots)
              if j * d < (i + 1) * sel and j * d + l > i * sel
            )
          scores.append((-score, i))
        chosen = {i for _, i in sorted(scores)[:n_sel]}
        rows = [s for s in range(start, t + 1) if real(s) and (s - start) // sel in chosen]
        o_slc = _softmax_read(qt, k[b, rows, h], v[b, rows, h])
        rows = [s for s in range(max(start, t - w + 1), t + 1) if real(s)]
        o_win = _softmax_read(qt, k[b, rows, h], v[b, rows, h])
        g = gates[b, t, h]
        out[b, t, h] = g[0] * o_cmp + g[1] * o_slc + g[2] * o_win
  return out


@pytest.mark.parametrize('sizes', SIZES)
@pytest.mark.parametrize('rows', IDS)
def test_sparse_equals_dense_equals_plain_float64(x64, sizes, rows):
  """The blocked form, the n x n reference and the token-by-token float64 reference agree,
  with right and left padding and packed rows (a padding gap inside one document)."""
  args = _inputs(sizes=SIZES[sizes])
  ids = IDS[rows]
  sparse_out = _run(*args, ids, 'sparse', SIZES[sizes])
  dense_out = _run(*args, ids, 'dense', SIZES[sizes])
  plain = _plain(*args, ids, *SIZES[sizes].values())
  np.testing.assert_allclose(sparse_out, plain, atol=1e-12, rtol=1e-12)
  np.testing.assert_allclose(dense_out, plain, atol=1e-12, rtol=1e-12)
  assert np.any(plain != 0)

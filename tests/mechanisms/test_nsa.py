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
from efficient_attn.ops import segments
from efficient_attn.ops.scaled_dot_product import softmax_attention

B, N, H, DIM = 2, 40, 2, 8
# (l, d, l', n, w): l = l' = 2d; l' != l; the two heads sharing one selection (a GQA group).
SIZES = {
  'same': dict(compress_block=4, compress_stride=2, select_block=4, num_selected=4, window=5),
  'mixed': dict(compress_block=6, compress_stride=2, select_block=8, num_selected=3, window=3),
  'grouped': dict(
    compress_block=4, compress_stride=2, select_block=4, num_selected=5, window=2, selection_heads=2
  ),
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


@functools.partial(jax.jit, static_argnames=('form', 'sizes', 'packed'))
def _nsa(q, k, v, gates, params, ids, *, form, sizes, packed=True):
  """The pure function, with `ids` as segment ids (packed) or as key padding (ids != 0:
  the rows-of-one-document path)."""
  rows = dict(segment_ids=ids) if packed else dict(mask=ids != 0)
  return nsa.nsa_attention(q, k, v, gates, params, form=form, query_block=8, **rows, **dict(sizes))


def _run(q, k, v, gates, params, ids, form, sizes, packed=True):
  ids = jnp.ones((B, N), jnp.int32) if ids is None else jnp.asarray(ids, jnp.int32)
  sizes = tuple(sorted(sizes.items()))
  return _nsa(q, k, v, gates, params, ids, form=form, sizes=sizes, packed=packed)


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


def _plain(q, k, v, gates, params, ids, sizes):
  """Token by token, float64: each real token's document from the ids (a run of equal
  non-zero ids), its blocks counted from the document's first token; a group of
  `selection_heads` heads ranks blocks by the sum of its heads' scores."""
  l, d, sel = sizes['compress_block'], sizes['compress_stride'], sizes['select_block']
  n_sel, w, group = sizes['num_selected'], sizes['window'], sizes.get('selection_heads', 1)
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
      current = (t - start) // sel
      block_scores = np.zeros((H, current + 1))
      o_cmp = np.zeros((H, DIM))
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
        o_cmp[h] = _softmax_read(
          qt, [c[1] for c in slots], np.array([c[2] for c in slots]).reshape(-1, DIM)
        )
        if slots:
          s = np.array([c[1] for c in slots]) @ qt
          prob = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
          for i in range(current + 1):
            block_scores[h, i] = sum(
              prob[m]
              for m, (j, _, _) in enumerate(slots)
              if j * d < (i + 1) * sel and j * d + l > i * sel
            )
      for h in range(H):
        qt = q[b, t, h] * scale
        first = h - h % group
        summed = block_scores[first : first + group].sum(0)
        forced = (0, current, current - 1)
        ranked = sorted((-np.inf if i in forced else -summed[i], i) for i in range(current + 1))
        chosen = {i for _, i in ranked[:n_sel]}
        rows = [s for s in range(start, t + 1) if real(s) and (s - start) // sel in chosen]
        o_slc = _softmax_read(qt, k[b, rows, h], v[b, rows, h])
        rows = [s for s in range(max(start, t - w + 1), t + 1) if real(s)]
        o_win = _softmax_read(qt, k[b, rows, h], v[b, rows, h])
        g = gates[b, t, h]
        out[b, t, h] = g[0] * o_cmp[h] + g[1] * o_slc + g[2] * o_win
  return out


@pytest.mark.parametrize('sizes', SIZES)
@pytest.mark.parametrize('rows', IDS)
def test_sparse_equals_dense_equals_plain_float64(x64, sizes, rows):
  """The blocked form, the n x n reference and the token-by-token float64 reference agree,
  with right and left padding and packed rows (a padding gap inside one document); rows
  without packing run both as key padding (one document per row) and as segment ids."""
  args = _inputs(sizes=SIZES[sizes])
  ids = IDS[rows]
  plain = _plain(*args, ids, SIZES[sizes])
  assert np.any(plain != 0)
  for packed in (True, False) if rows != 'packed' else (True,):
    for form in nsa.FORMS:
      got = _run(*args, ids, form, SIZES[sizes], packed)
      np.testing.assert_allclose(got, plain, atol=1e-12, rtol=1e-12, err_msg=f'{form} {packed}')


def _one_branch(branch):
  return jax.nn.one_hot(jnp.full((B, N, H), branch), 3, dtype=jnp.float64)


def test_each_branch_alone_is_the_attention_it_names(x64):
  """Gates that keep one branch: the window branch is local (sliding-window) softmax; the
  selected branch with n covering every block is causal softmax, over padding and packed
  rows. The compressed branch alone is checked by the token-by-token reference above."""
  q, k, v, _, params = _inputs()
  ids = jnp.asarray(IDS['packed'], jnp.int32)
  window = dict(SIZES['same'])
  got = _run(q, k, v, _one_branch(2), params, ids, 'sparse', window)
  local = jax.jit(local_attention, static_argnames=('window', 'causal'))
  want = local(q, k, v, window=window['window'], causal=True, segment_ids=ids)
  np.testing.assert_allclose(got, want, atol=1e-12)
  every = dict(window, num_selected=N // window['select_block'])
  got = _run(q, k, v, _one_branch(1), params, ids, 'sparse', every)
  mask = segments.attention_mask(ids, causal=True)
  want = jax.jit(softmax_attention)(q, k, v, mask=mask)
  want = jnp.where((ids != 0)[:, :, None, None], want, 0)
  np.testing.assert_allclose(got, want, atol=1e-12)
  fewer = _run(q, k, v, _one_branch(1), params, ids, 'sparse', window)
  assert not np.allclose(fewer, want)  # with fewer blocks it is not (the test can fail)


@functools.partial(jax.jit, static_argnames=('sizes',))
def _loss_and_grads(q, k, v, gates, params, ids, ct, *, sizes):
  loss = lambda *a: jnp.sum(nsa.nsa_attention(*a, segment_ids=ids, **dict(sizes)) * ct)
  return jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, gates, params)


def test_a_packed_row_equals_its_documents_alone_outputs_and_gradients():
  """float32, the blocked form: a row packing three documents (one after a padding gap)
  equals each document run alone at the start of its own row; the gradients of the
  inputs and of the compression MLPs too (summed over the documents)."""
  q, k, v, gates, params = _inputs(3, jnp.float32)
  ct = jax.random.normal(jax.random.PRNGKey(5), v.shape)
  q, k, v, gates, ct = (x[:1].repeat(B, 0) for x in (q, k, v, gates, ct))  # B copies of a row
  docs = [(0, 9), (9, 17), (28, 3)]  # the packed row 0 of IDS['packed'] without its last document
  ids = np.zeros((B, N), np.int32)
  for i, (s, l) in enumerate(docs):
    ids[0, s : s + l] = i + 1
  sizes = tuple(sorted(SIZES['mixed'].items()))
  _, packed = _loss_and_grads(q, k, v, gates, params, jnp.asarray(ids), ct, sizes=sizes)
  alone_grads = jax.tree.map(jnp.zeros_like, packed[4])
  for s, l in docs:
    take = lambda x: jnp.zeros_like(x[:1]).at[:, :l].set(x[:1, s : s + l]).repeat(B, 0)
    mine = np.zeros((B, N), np.int32)
    mine[0, :l] = 1
    args = [take(x) for x in (q, k, v, gates)]
    _, alone = _loss_and_grads(*args, params, jnp.asarray(mine), take(ct), sizes=sizes)
    for got, want in zip(packed[:4], alone[:4]):
      np.testing.assert_allclose(got[0, s : s + l], want[0, :l], atol=2e-5, rtol=1e-5)
    alone_grads = jax.tree.map(jnp.add, alone_grads, alone[4])
  for name in params:
    np.testing.assert_allclose(packed[4][name], alone_grads[name], atol=1e-4, rtol=1e-4)
  assert any(float(jnp.abs(packed[4][name]).max()) > 0 for name in params)


def test_bfloat16_is_finite_and_close_to_float32():
  """bfloat16 inputs at scale 8 (scores up to ~200): outputs and gradients finite, and the
  output within bfloat16's rounding of the float32 one (float32 inside)."""
  q, k, v, gates, params = _inputs(4, jnp.float32)
  q, k = 8 * q, 8 * k
  ct = jnp.ones(v.shape, jnp.bfloat16)
  ids = jnp.asarray(IDS['packed'], jnp.int32)
  sizes = tuple(sorted(SIZES['same'].items()))
  low = jax.tree.map(lambda x: x.astype(jnp.bfloat16), (q, k, v, gates, params))
  out = _nsa(*low, ids, form='sparse', sizes=sizes)
  assert out.dtype == jnp.bfloat16
  _, grads = _loss_and_grads(*low, ids, ct, sizes=sizes)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves((out, grads)))
  rounded = jax.tree.map(lambda x: x.astype(jnp.float32), low)
  want = _nsa(*rounded, ids, form='sparse', sizes=sizes)
  np.testing.assert_allclose(out.astype(jnp.float32), want, atol=0.05, rtol=0.05)


def test_the_blocked_form_never_forms_n_by_n():
  """At n = 1024 (l = d = 8, l' = 16, n = 4, w = 16) no array of the blocked form's
  program has n^2 elements or more; the dense reference's does (the check can fail)."""
  n = 1024
  x = jax.ShapeDtypeStruct((1, n, 1, DIM), jnp.float32)
  gates = jax.ShapeDtypeStruct((1, n, 1, 3), jnp.float32)
  sizes = dict(compress_block=8, compress_stride=8, select_block=16, num_selected=4, window=16)
  decl = ea.get_mechanism('nsa')
  specs = decl.params(decl.resolve(sizes), heads=1, head_dim=DIM, max_length=None, causal=True)
  params = {name: jax.ShapeDtypeStruct(s.shape, jnp.float32) for name, s in specs.items()}

  def largest(form):
    fn = lambda q, k, v, g, p: nsa.nsa_attention(q, k, v, g, p, form=form, **sizes)
    text = str(jax.make_jaxpr(fn)(x, x, x, gates, params))
    shapes = re.findall(r'\[([0-9,]+)\]', text)
    return max(int(np.prod([int(d) for d in s.split(',') if d])) for s in shapes)

  assert largest('sparse') < n * n <= largest('dense')


def test_bad_calls_refuse_in_one_line():
  q, k, v, gates, params = _inputs(0, jnp.float32)
  call = functools.partial(nsa.nsa_attention, q, k, v, gates, params, **SIZES['same'])
  cases = {
    'causal=False is not valid; NSA is causal only': dict(causal=False),
    "form='flash' is not valid": dict(form='flash'),
    'compress_stride=3 must divide compress_block=4': dict(compress_stride=3),
    'num_selected=2 is not valid': dict(num_selected=2),
    'selection_heads=3 must divide the heads (2)': dict(selection_heads=3),
  }
  for message, kw in cases.items():
    with pytest.raises(ValueError, match=re.escape(message)) as info:
      call(**kw)
    assert '\n' not in str(info.value)
  with pytest.raises(ValueError, match="compress_stride=2 must divide select_block=5"):
    ea.get_mechanism('nsa').resolve(dict(SIZES['same'], select_block=5))
  with pytest.raises(ValueError, match='causal'):
    ea.MultiHeadAttention(num_heads=H, mechanism='nsa', causal=False).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 8, 16))
    )

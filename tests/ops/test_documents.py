"""Packed rows (`segment_ids`) in the recurrences' forms (efficient_attn.ops.gated, .delta):
a packed row equals each of its documents run alone, outputs, final state AND gradients,
in float32 against the float64 definition; padding slack with NaN changes nothing; and a
sequence streamed in pieces (`initial_state` from the last piece's final state) equals one
call (docs/design.md, "Documents").

The rows (13 tokens, chunks of 4) hold: a document of one token, documents that cross a
chunk boundary, a padding gap inside a document, an id reused by a later document, leading
and trailing padding, and a row of random document lengths.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import main_runner
import numpy as np
import pytest

from efficient_attn.ops import delta
from efficient_attn.ops import gated
from efficient_attn.ops import segments

B, N, H, DK, DV, CHUNK = 2, 13, 2, 3, 2, 4


def packed_ids(seed=0):
  """`[2, 13]` segment ids: a crafted row and one of random document lengths (1 to 5)."""
  crafted = [3, 1, 1, 1, 1, 1, 1, 2, 2, 0, 2, 0, 0]  # 1 token; 1..6 crosses 4; a gap
  rng = np.random.default_rng(seed)
  row, doc = [0], 1  # leading padding
  while len(row) < N - 1:
    row += [doc] * int(rng.integers(1, 6))
    doc += 1
  row = (row[: N - 2] + [doc, 0])[:N]  # a last document of length 1, trailing padding
  return np.asarray([crafted, row], np.int32)


def test_the_rows_hold_what_the_docstring_says():
  ids = packed_ids()
  docs = np.asarray(segments.document_index(ids))
  real = ids != 0
  for r in range(B):
    lengths = np.bincount(docs[r][real[r]])
    assert 1 in lengths, ids[r]
    assert not real[r, -1], ids[r]
    crossing = [
      d for d in set(docs[r][real[r]]) if len({i // CHUNK for i in np.where(docs[r] == d)[0]}) > 1
    ]
    assert crossing, ids[r]


def _inputs(kind, dg, seed=0):
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((B, N, H, DK)) for _ in range(2))
  if kind == 'delta':
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.standard_normal((B, N, H, DV))
  g = None if dg is None else -rng.uniform(0.0, 1.0, (B, N, H, dg))
  beta = rng.uniform(0.0, 1.0, (B, N, H)) if kind == 'delta' else None
  s0 = rng.standard_normal((B, H, DK, DV))
  return q, k, v, g, beta, s0


FORMS = {
  'decay': (gated.gated_chunked, gated.gated_scan),
  'delta': (delta.delta_chunked, delta.delta_scan),
}
CASES = [('decay', 1), ('decay', 3), ('delta', None), ('delta', 1)]  # retention/Mamba-2, GLA,
# DeltaNet, Gated DeltaNet


def alone(scan, ids, q, k, v, g, beta, s0):
  """(out, final state) of a packed row computed document by document: each document's
  real tokens gathered and run unpacked by the definition (`scan`), the row's first from
  s0, the others from zero; padding's output 0; the final state the last document's."""
  with jax.ensure_compile_time_eval():  # `ids` are concrete; the rest may be traced
    docs = np.asarray(segments.document_index(ids))
  outs, finals = [], []
  for r in range(ids.shape[0]):
    out = jnp.zeros((N, H, v.shape[-1]), q.dtype)
    final = None
    for d in sorted(set(docs[r])):
      at = np.where((docs[r] == d) & (ids[r] != 0))[0]
      if not at.size:
        final = s0[r] if d == 0 else final
        continue
      take = lambda x: None if x is None else x[r : r + 1, at]
      start = s0[r : r + 1] if d == 0 else jnp.zeros_like(s0[r : r + 1])
      o, final = scan(*map(take, (q, k, v, g, beta)), initial_state=start)
      out = out.at[at].set(o[0])
      final = final[0]
    outs.append(out)
    finals.append(final)
  return jnp.stack(outs), jnp.stack(finals)


def _loss(fn, cotangents):
  def loss(*args):
    out, final = fn(*args)
    return jnp.sum(out * cotangents[0]) + jnp.sum(final * cotangents[1])

  return loss


@pytest.mark.parametrize('kind,dg', CASES)
def test_a_packed_row_equals_its_documents_alone(kind, dg):
  """Outputs, final state and the gradients of q, k, v, log-decay, beta and the initial
  state, of the chunk form and the token scan in float32, against the documents run alone
  by the definition in float64."""
  chunked, scan = FORMS[kind]
  ids = packed_ids()
  inputs = _inputs(kind, dg)
  rng = np.random.default_rng(1)
  cotangents = (rng.standard_normal((B, N, H, DV)), rng.standard_normal((B, H, DK, DV)))
  argnums = tuple(i for i, x in enumerate(inputs) if x is not None)
  with jax.enable_x64(True):
    f64 = [None if x is None else jnp.asarray(x, jnp.float64) for x in inputs]
    reference = functools.partial(alone, scan, ids)  # one compiled program, not op by op
    want, want_grads = jax.jit(
      lambda *a: (reference(*a), jax.grad(_loss(reference, cotangents), argnums)(*a))
    )(*f64)
    want, want_grads = jax.tree.map(np.asarray, (want, want_grads))
  f32 = [None if x is None else jnp.asarray(x, jnp.float32) for x in inputs]
  for name, form in (('chunk', functools.partial(chunked, chunk_size=CHUNK)), ('scan', scan)):

    def packed(q, k, v, g, beta, s0, form=form):
      return form(q, k, v, g, beta, initial_state=s0, segment_ids=jnp.asarray(ids))

    got, grads = jax.jit(
      lambda *a, packed=packed: (packed(*a), jax.grad(_loss(packed, cotangents), argnums)(*a))
    )(*f32)
    for x, w, what in zip(got, want, ('out', 'final state')):
      np.testing.assert_allclose(x, w, atol=1e-5, rtol=1e-5, err_msg=f'{name} {what}')
    for i, x, w in zip(argnums, grads, want_grads):
      np.testing.assert_allclose(x, w, atol=1e-5, rtol=1e-5, err_msg=f'{name} gradient {i}')


@pytest.mark.parametrize('kind,dg', [('decay', 3), ('delta', 1)])
def test_padding_slack_holding_nan_changes_nothing(kind, dg):
  """Whatever padding holds (NaN, -inf decays) reaches no output, state or gradient."""
  chunked, _ = FORMS[kind]
  ids = packed_ids()
  inputs = [None if x is None else jnp.asarray(x, jnp.float32) for x in _inputs(kind, dg)]
  pad = jnp.asarray(ids == 0)
  spoil = lambda x, bad: (
    None if x is None else jnp.where(pad.reshape(pad.shape + (1,) * (x.ndim - 2)), bad, x)
  )
  spoiled = [spoil(x, jnp.nan) for x in inputs[:3]] + [
    spoil(inputs[3], -jnp.inf),
    spoil(inputs[4], jnp.nan),
    inputs[5],
  ]
  run = lambda *a: chunked(
    *a[:5], initial_state=a[5], segment_ids=jnp.asarray(ids), chunk_size=CHUNK
  )
  loss = lambda *a: sum(jnp.sum(jnp.sin(x)) for x in run(*a))
  argnums = tuple(i for i, x in enumerate(inputs) if x is not None)
  both = jax.jit(lambda *a: (run(*a), jax.grad(loss, argnums)(*a)))  # one program, two calls
  (clean, clean_grads), (dirty, grads) = both(*inputs), both(*spoiled)
  for x, y in zip(clean, dirty):
    np.testing.assert_array_equal(x, y)
  for i, x, y in zip(argnums, grads, clean_grads):
    assert bool(jnp.all(jnp.isfinite(x))), i
    np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize('kind,dg', CASES)
@pytest.mark.parametrize('packed', [False, True])
def test_streaming_in_pieces_equals_one_call(kind, dg, packed):
  """The chunk form on pieces of a row (each from the last one's final state) equals one
  call, unpacked and packed (the cuts fall inside documents: a piece's first document
  continues the state it is given)."""
  chunked, _ = FORMS[kind]
  ids = jnp.asarray(packed_ids()) if packed else None
  inputs = [None if x is None else jnp.asarray(x, jnp.float32) for x in _inputs(kind, dg)]
  *xs, s0 = inputs
  run = jax.jit(lambda xs, s, ids: chunked(*xs, initial_state=s, segment_ids=ids, chunk_size=CHUNK))
  want_out, want_final = run(xs, s0, ids)
  cuts = (0, 3, 5, 8, 12, N)  # one piece of a single padding token
  docs = segments.document_index(packed_ids())
  assert bool(jnp.all(docs[:, cuts[1:-1]] == docs[:, np.asarray(cuts[1:-1]) - 1]))
  outs, s = [], s0
  for lo, hi in zip(cuts[:-1], cuts[1:]):
    cut = lambda x: None if x is None else x[:, lo:hi]
    out, s = run([cut(x) for x in xs], s, cut(ids))
    outs.append(out)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want_out, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(s, want_final, atol=1e-5, rtol=1e-5)


def test_bad_segment_ids_are_one_line():
  q, k, v, g, _, _ = (
    None if x is None else jnp.asarray(x, jnp.float32) for x in _inputs('decay', 1)
  )
  with pytest.raises(ValueError, match=r'gated_chunked: segment_ids of shape \(2, 5\)'):
    gated.gated_chunked(q, k, v, g, segment_ids=jnp.ones((B, 5), jnp.int32))
  with pytest.raises(ValueError, match='segment_ids of dtype float32'):
    gated.gated_chunked(q, k, v, g, segment_ids=jnp.ones((B, N), jnp.float32))


# A sequence split over 4 host CPU devices (in a subprocess: XLA_FLAGS before jax starts):
# documents that cross device boundaries, a device that one document passes through, a
# device of padding only inside a document, documents that start on a device boundary (one
# that fills its device and continues on the next).
SPLIT_IDS = [
  [1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 0, 0],
  [0, 0, 5, 5, 0, 0, 0, 0, 5, 6, 6, 6, 7, 7, 7, 0],
]
SPLIT_SCRIPT = r'''
import functools, json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
from efficient_attn.ops import delta, gated
assert jax.device_count() == 4, jax.devices()
ids = jnp.asarray(json.loads(sys.argv[1]), jnp.int32)
b, n, h, dk, dv = ids.shape + (2, 3, 2)
mesh = jax.make_mesh((4,), ('s',), axis_types=(jax.sharding.AxisType.Auto,))
rng = np.random.default_rng(0)
draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
q, k, v = draw(b, n, h, dk), draw(b, n, h, dk), draw(b, n, h, dv)
k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
g = -jnp.abs(draw(b, n, h, dk)) * 0.5
beta = jax.nn.sigmoid(draw(b, n, h))
cases = {  # (sharded form, chunk form, {argument: value}), the absent ones None
  'decay': (gated.decayed_sharded, gated.gated_chunked, {'g': g}),
  'delta': (delta.transition_sharded, delta.delta_chunked, {'g': g[..., :1], 'beta': beta}),
  'deltanet': (delta.transition_sharded, delta.delta_chunked, {'beta': beta}),
  'kda': (delta.transition_sharded, delta.delta_chunked, {'g': g, 'beta': beta}),
}
cotangent = draw(b, n, h, dv)
errors = {}
for name, (sharded, core, given) in cases.items():
  names = ('q', 'k', 'v') + tuple(given)
  xs = (q, k, v) + tuple(given.values())
  full = lambda *xs: {'g': None, 'beta': None, **dict(zip(names, xs))}
  def whole(*xs):
    a = full(*xs)
    return core(a['q'], a['k'], a['v'], a['g'], a['beta'], segment_ids=ids, chunk_size=2)[0]
  def block(ids, *xs):
    a = full(*xs)
    return sharded(core, a['q'], a['k'], a['v'], a['g'], a['beta'], segment_ids=ids,
                   chunk_size=2, axis='s')
  split = jax.jit(jax.shard_map(block, mesh=mesh, in_specs=(P(None, 's'),) * (len(xs) + 1),
                                out_specs=P(None, 's'), check_vma=False))  # as layers.parallel
  loss = lambda f: lambda *xs: jnp.sum(f(*xs) * cotangent)
  argnums = tuple(range(len(xs)))
  # one compiled program each, not op by op
  want = jax.jit(lambda *xs: (whole(*xs),) + jax.grad(loss(whole), argnums)(*xs))(*xs)
  got = jax.jit(
      lambda *xs: (split(ids, *xs),) + jax.grad(loss(lambda *a: split(ids, *a)), argnums)(*xs))(*xs)
  errors[name] = max(float(jnp.max(jnp.abs(a - w))) for a, w in zip(got, want))
print(json.dumps(errors))
'''


def test_a_split_sequence_equals_the_whole_on_packed_rows():
  """`decayed_sharded` and `transition_sharded` (4 devices, blocks of 4, chunks of 2) equal
  the unsplit chunk form on packed rows, outputs and gradients."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=f'{main_runner.XLA_FLAGS} --xla_force_host_platform_device_count=4',
  )
  proc = subprocess.run(
    [sys.executable, '-c', SPLIT_SCRIPT, json.dumps(SPLIT_IDS)],
    cwd=root,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  errors = json.loads(proc.stdout.strip().splitlines()[-1])
  assert max(errors.values()) < 1e-5, errors

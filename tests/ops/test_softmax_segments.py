"""Packed rows (`segment_ids`) through exact softmax: the plain einsum, the chunked (flash)
form with its block skipping, the mechanisms' `ctx.documents`, the fused kernels' argument
translation, local attention's clipped window, and the ring of a split layer.

The identity: a packed row equals each of its documents run alone, outputs AND gradients
(to 1e-5 in float32), causal and bidirectional, and equals the dense masked reference
(`segments.attention_mask`). The rows hold documents of random lengths, 1 included, one
across a chunk boundary, a padding gap, a reused id, leading and trailing padding. Block
skipping is checked by a NaN planted in the values of a skipped block: it reaches nothing
where the pair is skipped, and everything the block pair touches where it is not.
"""

import functools
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import main_runner
import numpy as np
import pytest

from efficient_attn import registry
from efficient_attn.mechanisms import local
from efficient_attn.mechanisms import softmax
from efficient_attn.ops import fused_softmax
from efficient_attn.ops import masking
from efficient_attn.ops import segments

H, D = 2, 4
ROWS = [
  # 5, 1, 9 (across the chunks at 8 and 16), 4, trailing padding
  [3] * 5 + [4] + [1] * 9 + [2] * 4 + [0] * 5,
  # leading padding, 1, a document of 11 with a gap, id 7 reused, 4, trailing padding
  [0, 7] + [2] * 5 + [0] + [2] * 6 + [7] + [5] * 4 + [0] * 5,
  # one long document (its every block pair is needed: the skip is the batch's)
  [0] + [6] * 21 + [0] * 2,
]
CHUNKS = {'q_chunk': 8, 'k_chunk': 4}


def _ids():
  return jnp.asarray(ROWS, jnp.int32)


def _inputs(ids, seed=0):
  b, n = ids.shape
  rng = np.random.default_rng(seed)
  q, k, v, g = (jnp.asarray(rng.normal(size=(b, n, H, D)), jnp.float32) for _ in range(4))
  return q, k, v, g


def _documents(ids):
  """[(row, token indices)] of every document of the packed rows (real tokens only)."""
  index, real = np.asarray(segments.document_index(ids)), np.asarray(segments.is_real(ids))
  return [
    (b, np.flatnonzero(real[b] & (index[b] == d)))
    for b in range(ids.shape[0])
    for d in np.unique(index[b][real[b]])
  ]


def _alone(fn, ids):
  """(q, k, v) -> fn run on each document alone, its outputs put back at the document's
  tokens (0 at padding)."""
  groups = _documents(ids)

  def run(q, k, v):
    out = jnp.zeros(q.shape[:3] + v.shape[3:], jnp.float32)
    for b, tokens in groups:
      one = fn(q[b : b + 1, tokens], k[b : b + 1, tokens], v[b : b + 1, tokens])
      out = out.at[b, tokens].set(one[0])
    return out

  return run


def _with_vjp(fn):
  """jit((q, k, v, g) -> (fn(q, k, v), its vjp of g))."""

  def both(q, k, v, g):
    out, pullback = jax.vjp(fn, q, k, v)
    return out, pullback(g)

  return jax.jit(both)


def _assert_close(got, want, atol=1e-5):
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-5)


def _mechanism(name, options):
  """(q, k, v, causal, ids) -> the registered mechanism's `attend`, documents in its ctx."""
  decl = registry.get_mechanism(name)
  resolved = decl.resolve(options)

  def run(q, k, v, causal, ids=None):
    ctx = registry.Context()
    mask = None
    if ids is not None:
      ctx.documents, mask = segments.document_index(ids), segments.is_real(ids)
    return decl.attend(resolved, {}, q, k, v, mask=mask, causal=causal, ctx=ctx)

  return run


def _cudnn_xla(q, k, v, causal, ids=None):
  """The cuDNN call's argument translation, run through XLA."""
  mask = documents = None
  if ids is not None:
    mask = segments.is_real(ids)
    documents = masking.segment_documents(ids, *ids.shape, 'test')
  return fused_softmax.cudnn_attention(
    q, k, v, mask, causal, D**-0.5, implementation='xla', documents=documents
  )


FORMS = {
  'softmax': lambda q, k, v, causal, ids=None: softmax.softmax_attention(
    q, k, v, causal=causal, segment_ids=ids
  ),
  'chunked': lambda q, k, v, causal, ids=None: softmax.chunked_softmax_attention(
    q, k, v, causal=causal, segment_ids=ids, **CHUNKS
  ),
  'mechanism-softmax': _mechanism('softmax', {}),
  'mechanism-softmax_chunked': _mechanism('softmax_chunked', CHUNKS),
  'cudnn-translation': _cudnn_xla,
  'mechanism-local': _mechanism('local', {'window': 64, 'block_size': 4}),
}


@pytest.mark.parametrize('causal', [True, False], ids=['causal', 'bidirectional'])
@pytest.mark.parametrize('form', list(FORMS))
def test_a_packed_row_equals_its_documents_alone_and_the_dense_reference(form, causal):
  ids = _ids()
  q, k, v, g = _inputs(ids)
  fn = FORMS[form]
  packed = _with_vjp(lambda q, k, v: fn(q, k, v, causal, ids))
  alone = _with_vjp(_alone(lambda q, k, v: fn(q, k, v, causal), ids))
  got = packed(q, k, v, g)
  _assert_close(got, alone(q, k, v, g))
  dense = segments.attention_mask(ids, causal=causal)
  reference = softmax.softmax_attention(q, k, v, mask=dense)
  _assert_close(got[0], reference)
  padding = ~np.asarray(segments.is_real(ids))
  assert not np.any(np.asarray(got[0])[padding]), 'a padding token has an output'


def test_local_windows_are_clipped_at_the_documents_bounds():
  """A window narrower than the documents, clipped at their bounds: each alone. (Without
  the padding gap: a window counts positions, so a gap inside a document narrows it.)"""
  ids = _ids().at[1, 7].set(2)
  q, k, v, g = _inputs(ids, seed=1)
  for causal in (True, False):
    fn = functools.partial(local.local_attention, window=5, causal=causal, block_size=2)
    packed = _with_vjp(lambda q, k, v, fn=fn: fn(q, k, v, segment_ids=ids))
    _assert_close(packed(q, k, v, g), _with_vjp(_alone(fn, ids))(q, k, v, g))


@pytest.mark.parametrize('form', ['softmax', 'chunked', 'mechanism-local'])
def test_bfloat16_packed_rows_stay_near_float32(form):
  """bfloat16 inputs (float32 scores and softmax inside) against the float32 packed row,
  to bfloat16's rounding of the inputs and output."""
  ids = _ids()
  q, k, v, _ = _inputs(ids, seed=4)
  fn = jax.jit(lambda q, k, v: FORMS[form](q, k, v, True, ids))
  bf16 = fn(*(x.astype(jnp.bfloat16) for x in (q, k, v)))
  assert bf16.dtype == jnp.bfloat16
  want = fn(*(x.astype(jnp.bfloat16).astype(jnp.float32) for x in (q, k, v)))
  np.testing.assert_allclose(np.asarray(bf16, np.float32), want, atol=2e-2, rtol=2e-2)


def _nan_in_values(v, row, tokens):
  return v.at[row, tokens].set(jnp.nan)


@pytest.mark.parametrize('skip', [True, False], ids=['skipped', 'computed'])
def test_a_nan_in_a_skipped_block_reaches_nothing(skip):
  """Key block 0 (tokens 0-3) shares no document with query block 2 (tokens 16-23) in
  rows 0 and 1: skipped, a NaN in row 0's values there reaches none of that block's
  outputs or gradients. Computed (`skip=False`), the masked weight 0 times NaN is NaN
  in all of them. The skip is the batch's: row 2, one long document, needs every pair."""
  ids = _ids()
  q, k, v, g = _inputs(ids)
  v = _nan_in_values(v, 0, [1])

  def run(rows):
    fn = lambda q, k, v: softmax.chunked_softmax_attention(
      q, k, v, segment_ids=ids[rows], skip=skip, **CHUNKS
    )
    out, (dq, _, _) = _with_vjp(fn)(q[rows], k[rows], v[rows], g[rows])
    return [bool(np.all(np.isfinite(np.asarray(x)[0, 16:]))) for x in (out, dq)]

  assert run(slice(0, 2)) == [skip, skip]
  assert run(slice(0, 3)) == [False, False]


def test_refusals_are_one_line():
  ids = _ids()
  q, k, v, _ = _inputs(ids)
  cases = [
    (lambda: softmax.softmax_attention(q, k, v, segment_ids=ids[:, :5]), r'segment_ids of shape'),
    (lambda: softmax.softmax_attention(q, k[:, :8], v[:, :8], segment_ids=ids), r'self-attention'),
    (
      lambda: softmax.chunked_softmax_attention(
        q, k, v, segment_ids=ids.astype(jnp.float32), **CHUNKS
      ),
      r'an integer dtype',
    ),
    (
      lambda: softmax.softmax_attention(
        q, k, v, segment_ids=ids, documents=masking.segment_documents(ids, 3, 24, 't')
      ),
      r'not both',
    ),
  ]
  for call, message in cases:
    with pytest.raises(ValueError, match=message) as info:
      call()
    assert '\n' not in str(info.value)


def test_the_fused_kernels_take_packed_rows_as_their_rule_says():
  """cuDNN takes documents as its dense mask (even lengths), the GPU kernel as its
  segment ids (a key-padding mask then allowed), splash as its `SegmentIds`; a packed
  call with q_length != kv_length is refused by every kernel."""
  b, n = 2, 128
  q = k = v = jnp.zeros((b, n, H, 16), jnp.bfloat16)
  real = np.ones((b, n), bool)
  real[0, -5:] = False
  choose = functools.partial(fused_softmax.choose, 'auto', q, k, v, real, True)
  assert choose(on='gpu', segments=True) == 'cudnn'
  assert choose(on='tpu', segments=True) == 'pallas'
  f32 = q.astype(jnp.float32)
  assert fused_softmax.choose('auto', f32, f32, f32, real, True, on='gpu', segments=True) == (
    'pallas'
  )
  assert fused_softmax.choose('auto', f32, f32, f32, real, True, on='gpu') == 'xla'
  reason = fused_softmax.why_not('pallas', q, k[:, :64], v[:, :64], None, False, 'gpu', True)
  assert 'packed documents' in reason


def test_the_gpu_kernel_takes_packed_rows():
  """The Triton kernel (Pallas, interpreted) with the documents as its segment ids and
  a key-padding mask equals the dense masked reference, padded queries 0."""
  ids = jnp.asarray([[1] * 9 + [2] + [3] * 15 + [0] * 7, [4] * 20 + [0] * 12], jnp.int32)
  rng = np.random.default_rng(3)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 32, 1, 16)), jnp.float32) for _ in range(3))
  documents = masking.segment_documents(ids, 2, 32, 'test')
  for causal in (True, False):
    got = fused_softmax.pallas_gpu_attention(
      q, k, v, segments.is_real(ids), causal, 0.25, interpret=True, documents=documents
    )
    mask = segments.attention_mask(ids, causal=causal)
    _assert_close(got, softmax.softmax_attention(q, k, v, mask, scale=0.25))


def test_splash_attention_takes_packed_rows():
  """Splash attention (Pallas, interpreted) with documents as its segment ids equals the
  dense masked reference; padded queries are 0."""
  ids = jnp.asarray([[1] * 40 + [2] * 1 + [3] * 60 + [0] * 27], jnp.int32)
  rng = np.random.default_rng(2)
  q, k, v = (jnp.asarray(rng.normal(size=(1, 128, 1, 16)), jnp.float32) for _ in range(3))
  documents = masking.segment_documents(ids, 1, 128, 'test')
  got = fused_softmax.pallas_attention(
    q, k, v, segments.is_real(ids), True, 0.25, interpret=True, documents=documents
  )
  want = softmax.softmax_attention(q, k, v, segments.attention_mask(ids, causal=True), scale=0.25)
  _assert_close(got, want)


# The ring of a split layer: 4 CPU devices in a subprocess (XLA_FLAGS before jax starts).
RING = r"""
import json
import jax, jax.numpy as jnp, numpy as np
from efficient_attn import registry
from efficient_attn.mechanisms import softmax
from efficient_attn.ops import segments
assert jax.device_count() == 4
mesh = jax.sharding.Mesh(np.array(jax.devices()), ('s',))
spec = jax.P(None, 's')
ids = jnp.asarray([
  [1] * 3 + [2] + [3] * 10 + [4] * 6 + [5] * 1 + [6] * 6 + [0] * 5,   # across devices
  [7] * 8 + [8] * 8 + [9] * 8 + [0] * 8,                              # one per device
], jnp.int32)
rng = np.random.default_rng(0)
q, k, v, g = (jnp.asarray(rng.normal(size=(2, 32, 2, 4)), jnp.float32) for _ in range(4))
index, real = segments.document_index(ids), segments.is_real(ids)
options = registry.get_mechanism('softmax').resolve()
blocks = {'dense': softmax.DENSE_BLOCK, 'chunked': softmax.chunked_block(2, 2)}

def ring(block, causal):
  def one(q, k, v, real, index):
    return softmax.ring_softmax(options, q, k, v, real, causal, 's', block, index)
  return jax.shard_map(one, mesh=mesh, in_specs=(spec,) * 5, out_specs=spec, check_vma=False)

def with_vjp(f):
  def both(q, k, v, g):
    out, pullback = jax.vjp(f, q, k, v)
    return (out,) + pullback(g)
  return jax.jit(both)

report = {}
for name, block in blocks.items():
  for causal in (True, False):
    split = with_vjp(lambda q, k, v: ring(block, causal)(q, k, v, real, index))
    whole = with_vjp(
        lambda q, k, v: softmax.softmax_attention(q, k, v, causal=causal, segment_ids=ids))
    got, want = split(q, k, v, g), whole(q, k, v, g)
    report[f'{name}-{causal}'] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                     for a, b in zip(got, want))
  # Row 1's device 0 holds document 0 alone: a NaN in its values reaches no other device.
  # (The ring skips a visiting block that no row needs: row 1 alone here.)
  bad = v.at[1, 2].set(jnp.nan)
  one = lambda q, k, v: ring(block, False)(q, k, v, real[1:], index[1:])
  out, dq, dk, dv = with_vjp(one)(q[1:], k[1:], bad[1:], g[1:])
  report[f'{name}-nan'] = [bool(np.all(np.isfinite(np.asarray(x)[0, 8:]))) for x in (out, dq)]
# Local attention's halo (window 7: it reaches the previous device, causal, or both).
from efficient_attn.mechanisms import local
decl = registry.get_mechanism('local')
for causal in (True, False):
  resolved = decl.resolve({'window': 7, 'block_size': 2})
  def one(q, k, v, real, index):
    ctx = registry.Context()
    ctx.documents = index
    return decl.attend_sharded(resolved, {}, q, k, v, mask=real, causal=causal, ctx=ctx, axis='s')
  split = jax.shard_map(one, mesh=mesh, in_specs=(spec,) * 5, out_specs=spec, check_vma=False)
  got = with_vjp(lambda q, k, v: split(q, k, v, real, index))(q, k, v, g)
  want = with_vjp(lambda q, k, v: local.local_attention(
      q, k, v, 7, causal=causal, block_size=2, segment_ids=ids))(q, k, v, g)
  report[f'local-{causal}'] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                  for a, b in zip(got, want))
print(json.dumps(report))
"""


def test_the_ring_carries_documents_and_skips_the_blocks_they_do_not_meet():
  """The split ring (dense and chunked blocks, causal zigzag and bidirectional) equals the
  unsplit packed row, outputs and gradients; a visiting block of documents the device's
  queries do not hold is skipped: a NaN in its values reaches none of them. Local
  attention's halo carries the documents too."""
  kwargs = main_runner.popen_kwargs()
  kwargs['env']['XLA_FLAGS'] += ' --xla_force_host_platform_device_count=4'
  proc = subprocess.run([sys.executable, '-c', RING], timeout=600, **kwargs)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  for name, value in report.items():
    if name.endswith('-nan'):
      assert value == [True, True], (name, value)
    else:
      assert value < 1e-5, (name, value)


REFUSING = (
  'bigbird fnet gmlp linformer longformer mixer nystrom reformer sinkhorn sparse synthesizer'
).split()


def test_the_declarations_say_who_honours_packed_rows_and_why_not():
  """softmax, softmax_chunked and local honour packed rows; the mechanisms without an
  exact form declare why not, in their own words (not the registry's default)."""
  default = registry.Mechanism.no_segments
  for name in ('softmax', 'softmax_chunked', 'local'):
    assert registry.get_mechanism(name).segments, name
  for name in REFUSING:
    decl = registry.get_mechanism(name)
    assert not decl.segments and decl.no_segments != default, name
    assert '\n' not in decl.no_segments, name

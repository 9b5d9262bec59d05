"""The Pallas kernels of the gated recurrences (efficient_attn.ops.kernels), in Pallas's interpret
mode on CPU: each kernel equals the float64 token recurrence and the XLA chunk form (outputs,
final states, and gradients of q, k, v, the log-decays, beta and the initial state), with
both drivers (the TPU's grid over chunks, the GPU's loop over chunks in value tiles); a
packed row equals each of its documents run alone (segment_ids); bfloat16 inputs stay
within a stated tolerance; the registry's properties (no look-ahead, left and right
padding, decode == parallel) hold with implementation='pallas'; `kernels.choose` resolves
and refuses in one line, and the kernels refuse what they cannot take.

Interpret mode compiles slowly, so the shapes are tiny and each check is one compiled
program: one forward + backward per kernel and dtype, one layer call per mechanism.
"""

import functools

from helpers import assert_close_where
from helpers import empty_cache
from helpers import random_variables
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import efficient_attn as ea
from efficient_attn import registry
from efficient_attn.mechanisms import gated_family
from efficient_attn.ops import delta
from efficient_attn.ops import gated
from efficient_attn.ops import kernels
from efficient_attn.ops import segments

ARGS = ('q', 'k', 'v', 'g', 'beta', 'state')
DELTA = ('delta', 'gated_delta', 'kda')
KERNEL = {
  'scalar': kernels.scalar_decay_chunked,
  'vector': kernels.vector_decay_chunked,
  'delta': kernels.delta_chunked,
  'gated_delta': kernels.delta_chunked,
  'kda': kernels.delta_chunked,
}
XLA = {
  'scalar': gated.gated_chunked,
  'vector': gated.gated_chunked,
  'delta': delta.delta_chunked,
  'gated_delta': delta.delta_chunked,
}
SCAN = {
  'scalar': gated.gated_scan,
  'vector': gated.gated_scan,
  'delta': delta.delta_scan,
  'gated_delta': delta.delta_scan,
  'kda': delta.delta_scan,  # its step decays the state's rows by a per-feature a_t too
}
# (length, chunk, dk, dv) per kernel: lengths that are and are not multiples of the chunk,
# chunks of 8 (padded to the kernels' 16-token tiles) and 16, feature dims below a tile
# (padded) and unequal key and value dims.
SHAPES = {
  'scalar': (37, 8, 8, 16),
  'vector': (37, 16, 6, 8),
  'delta': (24, 16, 16, 8),
  'gated_delta': (37, 8, 8, 8),
}
# The gated recurrences with Pallas kernels (RWKV-7's DPLR recurrence has none yet).
GATED = registry.names_where(
  lambda m: isinstance(m, gated_family.GatedRecurrence) and m.cores.pallas is not None
)


def _inputs(kind, n, dk, dv, b=2, h=2, seed=0):
  """float64 NumPy inputs; head 1 decays strongly (log-decays down to -30 a token), so a
  factor that overflowed or was not masked before exp would show."""
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((b, n, h, dk)) for _ in range(2))
  if kind in DELTA:
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the mechanisms' L2-normalised keys
  v = rng.standard_normal((b, n, h, dv))
  strength = np.array([1.0, 30.0])[:, None]
  g = -strength * rng.uniform(0.0, 1.0, (b, n, h, dk if kind in ('vector', 'kda') else 1))
  beta = rng.uniform(0.0, 1.0, (b, n, h))
  state = 0.5 * rng.standard_normal((b, h, dk, dv))
  return {
    'q': q,
    'k': k,
    'v': v,
    'g': None if kind == 'delta' else g,
    'beta': beta if kind in DELTA else None,
    'state': state,
  }


def _cast(args, dtype, qkv_dtype=None):
  return {
    n: None
    if a is None
    else jnp.asarray(a, qkv_dtype if qkv_dtype is not None and n in 'qkv' else dtype)
    for n, a in args.items()
  }


@functools.cache
def _kernel(kind, **static):
  """The kernel of `kind` with the reference's signature (q, k, v, g, beta, state, ...)."""
  kernel = KERNEL[kind]

  def run(q, k, v, g, beta, initial_state, **kwargs):
    return kernel(q, k, v, g, beta, initial_state=initial_state, **static, **kwargs)

  return run


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _vjp(fn, kind, c, args, cotangents, segment_ids=None):
  """(out, final state) of `fn` and the gradients {name: array} of every given input for the
  cotangents (one program: forward, then backward)."""
  names = [n for n in ARGS if args[n] is not None]
  kwargs = {} if c is None else {'chunk_size': c}
  if segment_ids is not None:
    kwargs['segment_ids'] = segment_ids

  def call(*xs):
    given = {**{n: None for n in ARGS}, **dict(zip(names, xs))}
    given['initial_state'] = given.pop('state')  # the recurrences' name for it
    return fn(**given, **kwargs)

  out, vjp = jax.vjp(call, *(args[n] for n in names))
  return out, dict(zip(names, vjp(cotangents)))


def _reference(kind, args, cotangents):
  """The float64 token recurrence's outputs and gradients (NumPy)."""
  with jax.enable_x64(True):
    out, grads = _vjp(
      SCAN[kind],
      kind,
      None,
      _cast(args, jnp.float64),
      tuple(jnp.asarray(c, jnp.float64) for c in cotangents),
    )
    return jax.tree.map(np.asarray, (out, grads))


def _cotangents(kind, args):
  rng = np.random.default_rng(7)
  b, n, h, dv = args['v'].shape
  return rng.standard_normal((b, n, h, dv)), rng.standard_normal(args['state'].shape)


def _error(got, want):
  """max |got - want| over max(1, max |want|)."""
  want = np.asarray(want, np.float64)
  return float(np.abs(np.asarray(got, np.float64) - want).max() / max(1.0, np.abs(want).max()))


def _errors(got, want):
  (out, state), grads = got
  (w_out, w_state), w_grads = want
  errors = {'out': _error(out, w_out), 'state': _error(state, w_state)}
  errors.update({f'd{n}': _error(grads[n], w_grads[n]) for n in w_grads})
  return errors


def _names(kind):
  """The outputs and gradients a kernel of `kind` gives."""
  return (
    {'out', 'state', 'dq', 'dk', 'dv', 'dstate'}
    | ({'dg'} if kind != 'delta' else set())
    | ({'dbeta'} if kind in DELTA else set())
  )


@pytest.mark.parametrize('kind', list(SHAPES))
def test_kernels_equal_the_float64_recurrence_and_the_xla_chunk_form(kind):
  """float32 kernels (forward and backward) against the float64 token recurrence: outputs,
  final states and the gradients of q, k, v, log-decays, beta and the initial state, to
  2e-5 of their scale (float32 round-off over a few dozen tokens); the outputs also against
  the XLA chunk form at the same chunk."""
  n, c, dk, dv = SHAPES[kind]
  args = _inputs(kind, n, dk, dv)
  cotangents = _cotangents(kind, args)
  want = _reference(kind, args, cotangents)
  f32 = _cast(args, jnp.float32)
  got = _vjp(_kernel(kind), kind, c, f32, tuple(jnp.asarray(x, jnp.float32) for x in cotangents))
  errors = _errors(got, want)
  assert set(errors) == _names(kind)
  assert max(errors.values()) < 2e-5, errors
  inputs = {('initial_state' if name == 'state' else name): x for name, x in f32.items()}
  xla_out, xla_state = XLA[kind](**inputs, chunk_size=c)
  (out, state), _ = got
  assert _error(out, xla_out) < 2e-6 and _error(state, xla_state) < 2e-6
  assert bool(jnp.all(jnp.isfinite(out)))


# Two packed rows of 37 tokens (chunks of 8: boundaries at 8, 16, 24, 32). Row 0: documents
# of 5 and 1 tokens, one of 17 real tokens across three chunk boundaries with a padding gap
# inside (padding inside a document changes nothing), one of 9, trailing padding. Row 1:
# id 5 reused by a later document (a document is a run, not an id), trailing padding.
SEGMENT_IDS = np.array(
  [
    [1] * 5 + [2] + [3] * 13 + [0] * 2 + [3] * 4 + [4] * 9 + [0] * 3,
    [5] * 9 + [6] * 3 + [5] * 20 + [0] * 5,
  ]
)
# (backend, value tile) per kind: each driver on two kinds; the GPU driver with two value
# tiles of the state (dv = 32, tiles of 16), whose shares of dq, dk, dg, dbeta are summed.
PACKED = {
  'scalar': ('mosaic', None),
  'vector': ('triton', 16),
  'gated_delta': ('triton', 16),
  'kda': ('mosaic', None),
}


def _documents_alone(ids):
  """(row, token indices) of each document of `ids` `[b, n]`, in order, with whether it is
  its row's first and last."""
  docs = []
  for r, row in enumerate(ids):
    index = np.asarray(segments.document_index(row[None]))[0]
    real = row != 0
    for d in range(index.max() + 1):
      docs.append((r, np.flatnonzero(real & (index == d)), d == 0, d == index.max()))
  return docs


def _packed_reference(kind, args, cotangents, ids):
  """The float64 recurrence run on each document of `ids` alone (its real tokens, the row's
  initial state for the row's first document, zeros for the others), one batched call:
  outputs and gradients scattered back to the packed rows (0 at padding), the final state
  the row's last document's."""
  docs = _documents_alone(ids)
  alone, cts_out, cts_state = {a: [] for a in args if args[a] is not None}, [], []
  for r, tokens, first, is_last in docs:
    for a, x in args.items():
      if x is None:
        continue
      if a == 'state':
        alone[a].append(x[r] if first else np.zeros_like(x[r]))
      else:  # the document's tokens first, then tokens that write and decay nothing
        alone[a].append(np.zeros_like(x[r]))
        alone[a][-1][: len(tokens)] = x[r][tokens]
    ct = np.zeros_like(cotangents[0][r])
    ct[: len(tokens)] = cotangents[0][r][tokens]
    cts_out.append(ct)
    cts_state.append(cotangents[1][r] if is_last else np.zeros_like(cotangents[1][r]))
  batched = {a: (np.stack(alone[a]) if a in alone else None) for a in args}
  (out_d, state_d), grads_d = _reference(kind, batched, (np.stack(cts_out), np.stack(cts_state)))
  out = np.zeros(args['v'].shape)
  state = np.zeros(args['state'].shape)
  grads = {a: np.zeros(args[a].shape) for a in alone}
  for i, (r, tokens, first, is_last) in enumerate(docs):
    out[r, tokens] = out_d[i, : len(tokens)]
    if is_last:
      state[r] = state_d[i]
    for a in alone:
      if a == 'state':
        grads[a][r] += grads_d[a][i] if first else 0.0
      else:
        grads[a][r, tokens] = grads_d[a][i, : len(tokens)]
  return (out, state), grads


@pytest.mark.parametrize('kind', list(PACKED))
def test_a_packed_row_equals_its_documents_run_alone(kind):
  """segment_ids (docs/design.md, "Documents"): the kernel on the packed rows of
  `SEGMENT_IDS` equals the float64 recurrence on each document alone, outputs, final
  states (the last document's) and the gradients of every input (0 at padding; the initial
  state's from the row's first document only), to 2e-5 of their scale; each driver on two
  kinds of recurrence."""
  backend, value_tile = PACKED[kind]
  n, c, dk, dv = SEGMENT_IDS.shape[1], 8, 8, 32 if value_tile else 8
  args = _inputs(kind, n, dk, dv, seed=3)
  cotangents = _cotangents(kind, args)
  want = _packed_reference(kind, args, cotangents, SEGMENT_IDS)
  kernel = _kernel(kind, backend=backend, value_tile=value_tile)
  got = _vjp(
    kernel,
    kind,
    c,
    _cast(args, jnp.float32),
    tuple(jnp.asarray(x, jnp.float32) for x in cotangents),
    jnp.asarray(SEGMENT_IDS, jnp.int32),
  )
  errors = _errors(got, want)
  assert set(errors) == _names(kind)
  assert max(errors.values()) < 2e-5, errors
  padding = SEGMENT_IDS == 0
  assert not np.asarray(got[0][0])[padding].any(), 'a padding token has an output'


# bfloat16: measured at these shapes, the largest error (of outputs, states and gradients)
# is 8e-3 of the scale (float32's: 2.5e-6).
BF16_TOLERANCE = 2e-2


@pytest.mark.parametrize('kind', list(SHAPES))
def test_bfloat16_inputs_stay_within_a_stated_tolerance(kind):
  """bfloat16 q, k, v (the log-decays, beta and the state stay float32) against the float64
  recurrence on the same (unrounded) inputs: every output, state and gradient within
  BF16_TOLERANCE = 2e-2 of its scale (max(1, max |reference|)), where float32 is within
  2e-5 (the test above). Why 2e-2: bfloat16 keeps 8 significant bits, so rounding q, k, v
  and every dot operand (the scores, the state, the pseudo-values) costs up to 2^-9 = 0.2%
  each; an output sums a few dozen such products (the chunk's tokens and the state's
  dk terms) and a gradient passes through two or three rounded dots, so errors of ~1% of
  the scale are expected (measured: 3e-3 to 8e-3), and 2e-2 leaves room without admitting
  an error of the float32 kind (a wrong factor moves results by O(1) of their scale)."""
  n, c, dk, dv = SHAPES[kind]
  args = _inputs(kind, n, dk, dv)
  cotangents = _cotangents(kind, args)
  want = _reference(kind, args, cotangents)
  bf16 = _cast(args, jnp.float32, jnp.bfloat16)
  got = _vjp(_kernel(kind), kind, c, bf16, tuple(jnp.asarray(x, jnp.float32) for x in cotangents))
  assert got[1]['q'].dtype == jnp.bfloat16 and got[0][0].dtype == jnp.float32
  errors = _errors(got, want)
  assert max(errors.values()) < BF16_TOLERANCE, errors
  assert max(errors.values()) > 1e-4, errors  # bfloat16 did reach the kernel


def _batch(n, pad, cut, width=8):
  """Four rows of one call: x; x changed after token `cut`; x with its last `pad` tokens
  replaced by junk and masked (right padding); `pad` masked junk tokens, then x's first
  n - pad (left padding). Returns (inputs `[4, n, width]`, key mask `[4, n]`)."""
  x = jax.random.normal(jax.random.PRNGKey(0), (1, n, width))
  junk = 10.0 * jax.random.normal(jax.random.PRNGKey(9), (1, n, width))
  t = jnp.arange(n)[None, :, None]
  rows = [
    x,
    jnp.where(t > cut, junk, x),
    jnp.where(t >= n - pad, junk, x),
    jnp.concatenate([junk[:, :pad], x[:, : n - pad]], axis=1),
  ]
  valid = jnp.ones((4, n), bool).at[2, n - pad :].set(False).at[3, :pad].set(False)
  return jnp.concatenate(rows), valid


@pytest.mark.parametrize('mechanism', GATED)
def test_the_registry_properties_hold_with_the_kernels(mechanism):
  """tests/layers/test_attention.py's no look-ahead and padding properties and
  tests/layers/test_decode.py's
  decode == parallel, for the five recurrences with implementation='pallas' (interpreted),
  in one compiled call of a batch of four rows (`_batch`), chunks of 8 over 40 tokens:
  changing the tokens after `cut` moves no output at or before it and does move later ones;
  masked junk at the end (right padding) moves no real output; masked junk in front (left
  padding) gives the outputs of the sequence alone; decoding token by token gives the
  parallel outputs; and the kernel's outputs equal the XLA chunk form's."""
  n, pad, cut = 40, 11, 17
  options = {**ea.get_mechanism(mechanism).example, 'chunk_size': 8}
  layer = ea.MultiHeadAttention(
    num_heads=2, mechanism=mechanism, causal=True, options={**options, 'implementation': 'pallas'}
  )
  reference = layer.clone(options={**options, 'implementation': 'xla'})
  x, valid = _batch(n, pad, cut)
  variables = random_variables(layer, x)
  call = lambda lay: jax.jit(lambda v, z, m: lay.apply(v, z, mask=m))
  assert 'pallas_call' in str(jax.make_jaxpr(call(layer))(variables, x, valid))
  y = call(layer)(variables, x, valid)
  assert_close_where(y[1], y[0], jnp.arange(n) <= cut, 'outputs up to the cut')
  assert not np.allclose(y[1, cut + 1 :], y[0, cut + 1 :])
  assert_close_where(y[2], y[0], valid[2], 'right padding: real outputs')
  assert_close_where(y[3, pad:], y[0, : n - pad], valid[3, pad:], 'left padding')
  assert_close_where(y, call(reference)(variables, x, valid), valid, 'kernel vs XLA')

  dec = reference.clone(decode=True)
  cache = empty_cache(dec, variables, x[:1])
  step = jax.jit(lambda c, z: dec.apply({**variables, **c}, z, mutable=['cache']))
  outs = []
  for t in range(n):
    out, cache = step(cache, x[:1, t : t + 1])
    outs.append(out)
  assert_close_where(jnp.concatenate(outs, axis=1), y[:1], valid[:1], 'decode == parallel')


@pytest.mark.parametrize('mechanism', ['gla', 'gated_deltanet'])
def test_a_layers_gradients_through_the_kernels_equal_the_xla_forms(mechanism):
  """The gradients of a whole layer (its parameters, among them the gate projections that
  make the log-decays and beta, and its input) with implementation='pallas' equal those with
  'xla', for the per-feature decay and the gated delta rule (24 tokens, chunks of 8)."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 24, 8))
  grads = {}
  for impl in ('pallas', 'xla'):
    layer = ea.MultiHeadAttention(
      num_heads=2,
      mechanism=mechanism,
      causal=True,
      options={'chunk_size': 8, 'implementation': impl},
    )
    variables = random_variables(layer, x)
    loss = lambda v, z, layer=layer: jnp.sum(jnp.sin(layer.apply(v, z)))
    grads[impl] = jax.jit(jax.grad(loss, argnums=(0, 1)))(variables, x)
  for (path, got), want in zip(
    jax.tree_util.tree_flatten_with_path(grads['pallas'])[0], jax.tree.leaves(grads['xla'])
  ):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(
      got, want, atol=2e-5 * scale, rtol=1e-4, err_msg=jax.tree_util.keystr(path)
    )


def test_choose_resolves_once_and_refuses_in_one_line():
  """'auto' is 'xla' on every platform until a measurement fills `kernels.AUTO`; 'pallas' is
  honoured on CPU (interpreted), GPU and TPU; what the kernels cannot take is refused in one
  line that names it, by `choose` and by a layer that asks for it."""
  assert kernels.AUTO == {}
  for on in ('cpu', 'gpu', 'tpu'):
    assert kernels.choose('auto', on=on) == 'xla'
    assert kernels.choose('pallas', on=on) == 'pallas'
    assert kernels.choose('xla', form='naive', dtype=jnp.float16, on=on) == 'xla'
    assert kernels.choose('auto', form='naive', on=on) == 'xla'
  assert kernels.choose('pallas', dtype=jnp.bfloat16, on='cpu') == 'pallas'
  for kwargs, message in [
    (dict(requested='cuda'), "implementation='cuda'; valid: auto, xla, pallas"),
    (
      dict(requested='pallas', form='naive'),
      "cannot run this call: form='naive' is the token-by-token recurrence",
    ),
    (dict(requested='pallas', dtype=jnp.float16), 'float32 or bfloat16 q, k, v, not float16'),
    (dict(requested='pallas', on='metal'), "this backend is 'metal'"),
  ]:
    with pytest.raises(ValueError, match=message) as e:
      kernels.choose(**kwargs)
    assert '\n' not in str(e.value)
  layer = ea.MultiHeadAttention(
    num_heads=2, mechanism='gla', causal=True, options={'implementation': 'pallas', 'form': 'naive'}
  )
  x = jnp.zeros((1, 8, 8))
  with pytest.raises(ValueError, match="implementation='pallas' cannot run this call: form="):
    layer.init(jax.random.PRNGKey(0), x)
  with pytest.raises(
    ValueError, match="option implementation='triton' of mechanism 'gla' is not valid"
  ):
    ea.MultiHeadAttention(
      num_heads=2, mechanism='gla', causal=True, options={'implementation': 'triton'}
    ).init(jax.random.PRNGKey(0), x)


def test_the_kernels_refuse_what_they_cannot_take_in_one_line():
  """A shape, option or input the kernels cannot honour raises a one-line ValueError naming
  the value and the valid ones, before anything is compiled."""
  x = jnp.zeros((1, 8, 2, 4))
  g, beta, ids = jnp.zeros((1, 8, 2, 1)), jnp.zeros((1, 8, 2)), jnp.ones((1, 8), jnp.int32)
  x16 = x.astype(jnp.float16)
  cases = [
    (kernels.scalar_decay_chunked, (x, x, x, g), dict(precision='fp32'), "precision='fp32'; valid"),
    (kernels.scalar_decay_chunked, (x, x, x, g), dict(backend='cuda'), "backend='cuda'; valid"),
    (kernels.scalar_decay_chunked, (x, x, x, jnp.zeros((1, 8, 2, 4))), {}, 'log_decay of shape'),
    (kernels.vector_decay_chunked, (x, x, x, g), {}, r'valid: \[1, 8, 2, 4\]'),
    (kernels.scalar_decay_chunked, (x, x, x, g, beta), {}, 'beta is given'),
    (kernels.delta_chunked, (x, x, x, g), {}, 'beta is None'),
    (kernels.delta_chunked, (x, x, x, g, beta), dict(segment_ids=ids[:, :4]), 'segment_ids of'),
    (
      kernels.delta_chunked,
      (x, x, x, g, beta),
      dict(segment_ids=jnp.ones((1, 8))),
      'segment_ids of dtype float32',
    ),
    (kernels.delta_chunked, (x, x, x, g, beta), dict(initial_state=x), 'initial_state of'),
    (kernels.delta_chunked, (x16, x16, x16, g, beta), {}, 'dtype float16'),
  ]
  for kernel, args, kwargs, message in cases:
    with pytest.raises(ValueError, match=message) as e:
      kernel(*args, **kwargs)
    assert '\n' not in str(e.value)


def test_the_xla_chunk_forms_bfloat16_path_is_stable(tmp_path):
  """benchmarks.gated_precision at a tiny shape (2 heads of 16, 64 tokens, chunks of 16): for
  each of the five recurrences, the XLA chunk form's outputs, final state and gradients
  against the float64 recurrence on the same bfloat16-rounded inputs. float32 inputs stay
  within 1e-5 of the scale (measured ~3e-7: float32 round-off); bfloat16 inputs, whose
  matmuls take bfloat16 operands (float32 accumulation; float32 states, decays, cumulative
  sums and triangular inverse), within 2e-2 (measured 1e-3 to 9e-3: each rounded operand
  costs up to 2^-9 and outputs and gradients pass through two or three rounded products),
  and above 1e-4, which float32 arithmetic on these inputs would not reach, so the bfloat16
  operands did take effect."""
  from benchmarks import gated_precision  # pylint: disable=g-import-not-at-top

  data = gated_precision.main(
    ['--length=64', '--heads=2', '--head_dim=16', '--chunk_size=16', f'--out={tmp_path}', '--quiet']
  )
  records = data['records']
  assert [(r['recurrence'], r['dtype']) for r in records] == [
    (name, dtype) for name in gated_precision.RECURRENCES for dtype in ('float32', 'bfloat16')
  ]
  for r in records:
    errors = [r['out_error'], r['state_error'], r['grad_error']]
    if r['dtype'] == 'float32':
      assert max(errors) < 1e-5, r
    else:
      assert 1e-4 < max(errors) < 2e-2, r
  assert (tmp_path / 'gated_precision.md').exists()

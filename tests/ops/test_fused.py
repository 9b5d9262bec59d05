"""The accelerator dispatch of exact attention (efficient_attn.ops.fused_softmax), tested on CPU.

The rule is tested with faked platforms; the cuDNN call's argument translation
runs through XLA (`implementation='xla'` of the same jax call); the Pallas
splash kernel runs in interpret mode. All against the float64 NumPy reference.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from pattern_reference import np_masked_attention
import pytest

import efficient_attn as ea
from efficient_attn.ops import fused_softmax

BF16 = jnp.bfloat16


def _qkv(b=2, n=128, h=2, d=16, dtype=jnp.float32, seed=0, nk=None):
  rng = np.random.default_rng(seed)
  shapes = [(b, n, h, d), (b, nk or n, h, d), (b, nk or n, h, d)]
  return tuple(jnp.asarray(rng.normal(size=s), dtype) for s in shapes)


def _key_mask(b, n, left=False):
  """Row 0 masks its last quarter; row 1 masks every key (its output must be 0).

  left: row 1 masks its first quarter instead (left padding): under causal masking
  its first queries see no key, and their outputs must be 0.
  """
  m = np.ones((b, n), bool)
  m[0, 3 * n // 4 :] = False
  m[1] = False
  if left:
    m[1, n // 4 :] = True
  return m


@pytest.mark.parametrize(
  'case, on, expected',
  [
    (dict(), 'cpu', 'xla'),
    (dict(dtype=BF16), 'gpu', 'cudnn'),
    (dict(dtype=BF16, causal=True), 'gpu', 'cudnn'),
    (dict(dtype=BF16, mask='keys'), 'gpu', 'cudnn'),
    (dict(), 'gpu', 'pallas'),  # float32: the Pallas kernel
    (dict(mask='keys'), 'gpu', 'xla'),  # ... which takes no mask
    (dict(dtype=BF16, dropout=True), 'gpu', 'xla'),
    (dict(dtype=BF16, weights=True), 'gpu', 'xla'),
    (dict(dtype=BF16, d=12), 'gpu', 'xla'),  # head dim not a multiple of 8
    (dict(dtype=BF16, causal=True, nk=64), 'gpu', 'xla'),  # causal cross-attention
    (dict(dtype=BF16, mask='per_head'), 'gpu', 'xla'),
    (dict(), 'tpu', 'pallas'),
    (dict(mask='keys', causal=True), 'tpu', 'pallas'),
    (dict(n=96), 'tpu', 'xla'),  # not a multiple of 128
    (dict(nk=256), 'tpu', 'xla'),  # cross-attention
  ],
)
def test_auto_picks_the_fused_kernel_only_when_it_is_exact(case, on, expected):
  case = dict(case)
  mask, flags = case.pop('mask', None), {f: case.pop(f, False) for f in ('dropout', 'weights')}
  causal = case.pop('causal', False)
  q, k, v = _qkv(**case)
  if mask == 'keys':
    mask = _key_mask(q.shape[0], k.shape[1])
  elif mask == 'per_head':
    mask = np.ones((q.shape[0], q.shape[2], q.shape[1], k.shape[1]), bool)
  assert fused_softmax.choose('auto', q, k, v, mask, causal, on=on, **flags) == expected
  assert fused_softmax.choose('xla', q, k, v, mask, causal, on=on, **flags) == 'xla'


def test_an_explicit_request_that_cannot_run_says_why():
  q, k, v = _qkv()
  with pytest.raises(ValueError, match="'cudnn'.*runs on gpu.*'cpu'"):
    fused_softmax.choose('cudnn', q, k, v, on='cpu')
  with pytest.raises(ValueError, match="'cudnn'.*float16 or bfloat16, not float32"):
    fused_softmax.choose('cudnn', q, k, v, on='gpu')
  with pytest.raises(ValueError, match="'pallas' cannot apply attention dropout"):
    fused_softmax.choose('pallas', q, k, v, dropout=True, on='tpu')
  with pytest.raises(ValueError, match="'flash'; valid: auto, xla, cudnn, pallas"):
    fused_softmax.choose('flash', q, k, v)


@pytest.mark.parametrize('kind', ['cudnn', 'pallas'])
@pytest.mark.parametrize(
  'causal, masked', [(False, False), (True, False), (False, True), (True, True), (True, 'left')]
)
def test_fused_paths_equal_the_reference(kind, causal, masked, x64):
  del x64  # the reference is float64; the kernels run in float32
  q, k, v = _qkv(n=128 if kind == 'pallas' else 10)
  mask = _key_mask(2, k.shape[1], left=masked == 'left') if masked else None
  n = q.shape[1]
  allowed = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
  want = np_masked_attention(q, k, v, allowed, key_padding=mask, scale=0.3)
  if kind == 'cudnn':
    run = functools.partial(fused_softmax.cudnn_attention, implementation='xla')
  else:
    run = functools.partial(fused_softmax.pallas_attention, interpret=True)
  got = jax.jit(lambda q, k, v: run(q, k, v, mask, causal, 0.3))(q, k, v)
  np.testing.assert_allclose(got, want, atol=2e-5)
  if masked == 'left':
    assert not np.any(np.asarray(got)[1, : k.shape[1] // 4])
  elif masked:
    assert not np.any(np.asarray(got)[1])


def test_layer_runs_the_faked_platforms_kernel_with_the_einsums_values_and_grads(monkeypatch):
  """A layer on a faked TPU runs splash attention (interpret mode): same output
  and gradients as the einsum; sown weights still come from the einsum."""
  calls, kernel = [], fused_softmax.pallas_attention

  def splash(*args):
    calls.append(1)
    return kernel(*args, interpret=True)

  monkeypatch.setattr(fused_softmax, 'pallas_attention', splash)
  monkeypatch.setattr(fused_softmax, 'platform', lambda: 'tpu')
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 128, 16))
  pad = _key_mask(2, 128)[:1].repeat(2, 0)
  results = {}
  for impl in ('auto', 'xla'):
    layer = ea.MultiHeadAttention(
      num_heads=2, mechanism='softmax', causal=True, options={'implementation': impl}
    )

    @jax.jit  # one compiled program (eagerly, every operation would compile alone)
    def run(x, layer=layer):
      params = layer.init(jax.random.PRNGKey(1), x, mask=pad)
      loss = lambda p: jnp.sum(layer.apply(p, x, mask=pad) ** 2)
      value_and_grad = jax.value_and_grad(loss)(params)
      _, state = layer.apply(params, x, mask=pad, sow_weights=True, mutable=['intermediates'])
      return value_and_grad, jax.tree_util.tree_leaves(state)

    results[impl], results[impl + '_weights'] = run(x)
  assert len(calls) == 3  # the 'auto' layer, traced once: init, value_and_grad, the sown call
  np.testing.assert_allclose(results['auto'][0], results['xla'][0], rtol=1e-5)
  jax.tree_util.tree_map(
    functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
    results['auto'][1],
    results['xla'][1],
  )
  for a, b in zip(results['auto_weights'], results['xla_weights']):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.skipif(jax.default_backend() != 'gpu', reason='needs a GPU (cuDNN)')
@pytest.mark.parametrize('causal, masked', [(False, False), (True, False), (False, True)])
def test_cudnn_on_a_gpu_equals_the_einsum(causal, masked):
  """Only where a GPU is lent: cuDNN flash attention in bfloat16, values and
  gradients, against the library's einsum on the same bfloat16 inputs."""
  from efficient_attn.mechanisms import softmax  # pylint: disable=g-import-not-at-top

  q, k, v = _qkv(n=256, d=64, dtype=BF16)
  mask = _key_mask(2, 256) if masked else None

  def grads(fn):
    return jax.value_and_grad(
      lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums=(0, 1, 2)
    )(q, k, v)

  assert fused_softmax.choose('auto', q, k, v, mask, causal) == 'cudnn'
  got = grads(lambda a, b, c: fused_softmax.cudnn_attention(a, b, c, mask, causal, 0.125))
  want = grads(lambda a, b, c: softmax.softmax_attention(a, b, c, mask, causal, 0.125))
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    np.testing.assert_allclose(g, w, atol=0.03 * max(1.0, np.abs(w).max()))

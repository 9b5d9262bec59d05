"""The Pallas GPU flash kernel behind implementation='pallas' (efficient_attn.ops.fused_softmax),
on CPU.

JAX's Triton kernel (`jax.experimental.pallas.ops.gpu.attention.mha`) runs in
Pallas interpret mode against a float64 NumPy reference, forward and
gradients; the dispatch rule is tested with a faked 'gpu' platform. Timings and
the kernel compiled by Triton are `benchmarks/gpu_suite.sh`'s business.
"""

import jax
import jax.numpy as jnp
import numpy as np
from pattern_reference import np_masked_attention
import pytest

import efficient_attn as ea
from efficient_attn.ops import fused_softmax

SCALE = 0.3


def _qkv(b=2, n=48, h=2, d=24, dtype=np.float32, nk=None, seed=0):
  """n=48: not a multiple of JAX's default blocks, so `gpu_block_sizes` cuts them to 16;
  d=24: the kernel pads the head dim to a power of two (32) and masks the padding."""
  rng = np.random.default_rng(seed)
  shapes = [(b, n, h, d), (b, nk or n, h, d), (b, nk or n, h, d)]
  return tuple(rng.normal(size=s).astype(dtype) for s in shapes)


def np_attention_and_grads(q, k, v, g, causal, scale):
  """Float64 out `[b, n, h, d]` of dense softmax attention and d sum(out * g) / d (q, k, v)."""
  q, k, v, g = (np.asarray(x, np.float64) for x in (q, k, v, g))
  n = q.shape[1]
  allowed = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
  out = np_masked_attention(q, k, v, allowed, scale=scale)
  s = np.where(allowed, np.einsum('bqhd,bkhd->bhqk', q, k) * scale, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  dv = np.einsum('bhqk,bqhd->bkhd', p, g)
  dp = np.einsum('bqhd,bkhd->bhqk', g, v)
  ds = p * (dp - (dp * p).sum(-1, keepdims=True))
  dq = np.einsum('bhqk,bkhd->bqhd', ds, k) * scale
  dk = np.einsum('bhqk,bqhd->bkhd', ds, q) * scale
  return out, (dq, dk, dv)


@pytest.fixture(scope='module')
def kernel_run():
  """causal -> a jitted (q, k, v, g) -> (out, grads of sum(out * g)) of the interpreted kernel."""
  compiled = {}

  def get(causal):
    if causal not in compiled:

      def loss(q, k, v, g):
        out = fused_softmax.pallas_gpu_attention(q, k, v, None, causal, SCALE, interpret=True)
        return jnp.sum(out * g), out

      vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
      compiled[causal] = lambda *a: (lambda r: (r[0][1], r[1]))(vg(*a))
    return compiled[causal]

  return get


@pytest.mark.parametrize('causal', [False, True])
def test_kernel_equals_the_float64_reference_forward_and_gradients(kernel_run, causal):
  q, k, v = _qkv()
  g = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)
  out, grads = kernel_run(causal)(q, k, v, g)
  want, want_grads = np_attention_and_grads(q, k, v, g, causal, SCALE)
  np.testing.assert_allclose(out, want, atol=2e-5)
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, atol=1e-4)


def test_block_sizes_are_cut_to_divide_the_length():
  assert fused_softmax.gpu_block_sizes(48).block_q == 16
  assert fused_softmax.gpu_block_sizes(48).block_kv_dq == 16
  assert fused_softmax.gpu_block_sizes(4096) == fused_softmax._gpu_kernel().BlockSizes(
    *fused_softmax.GPU_BLOCKS
  )
  assert fused_softmax.gpu_block_sizes(4096, (32,) * 6).block_q_dq == 32


def test_the_rule_takes_the_gpu_kernel_after_cudnn():
  """'auto' on a GPU: float32 goes to the kernel (measured faster than the einsum on an
  H100), bfloat16 to cuDNN, a mask the kernel cannot take to the einsum."""
  q, k, v = _qkv()
  assert fused_softmax.choose('pallas', q, k, v, causal=True, on='gpu') == 'pallas'
  assert fused_softmax.choose('auto', q, k, v, on='gpu') == 'pallas'
  assert fused_softmax.choose('auto', q, k, v, causal=True, on='gpu') == 'pallas'
  mask = np.ones((q.shape[0], k.shape[1]), bool)
  assert fused_softmax.choose('auto', q, k, v, mask, on='gpu') == 'xla'
  h = tuple(x.astype(jnp.bfloat16) for x in (q, k, v))
  assert fused_softmax.choose('pallas', *h, on='gpu') == 'pallas'
  assert fused_softmax.choose('auto', *h, on='gpu') == 'cudnn'


@pytest.mark.parametrize(
  'case, message',
  [
    (dict(mask=True), 'takes no mask .*key padding cannot be expressed exactly'),
    (dict(nk=64), 'self-attention; q_length 48 != kv_length 64'),
    (dict(n=40), 'multiples of 16, not 40'),
    (dict(d=8), 'head dim from 16 to 256, not 8'),
    (dict(dtype=np.float64), 'float32, bfloat16 or float16, not float64'),
    (dict(on='cpu'), "runs on tpu or gpu, and this backend is 'cpu'"),
  ],
)
def test_a_call_the_gpu_kernel_cannot_take_is_refused_in_one_line(case, message):
  case = dict(case)
  on, mask = case.pop('on', 'gpu'), case.pop('mask', False)
  q, k, v = _qkv(**case)
  mask = np.ones((q.shape[0], k.shape[1]), bool) if mask else None
  full = "implementation='pallas' cannot run this call: .*" + message
  with pytest.raises(ValueError, match=full) as e:
    fused_softmax.choose('pallas', q, k, v, mask, on=on)
  assert '\n' not in str(e.value)
  if on == 'gpu':  # the kernel's own entry point says the same
    with pytest.raises(ValueError, match=full):
      fused_softmax.pallas_gpu_attention(q, k, v, mask, interpret=True)


def test_softmax_chunked_runs_the_gpu_kernel_on_a_faked_gpu(monkeypatch):
  """implementation='pallas' on a (faked) GPU reaches the Triton kernel (interpreted)
  with the mechanism's scale and causality, and gives the reference's values."""
  calls, kernel = [], fused_softmax.pallas_gpu_attention

  def spy(*args):
    calls.append(args[4:])  # causal, scale
    return kernel(*args, interpret=True)

  monkeypatch.setattr(fused_softmax, 'pallas_gpu_attention', spy)
  monkeypatch.setattr(fused_softmax, 'platform', lambda: 'gpu')
  q, k, v = _qkv()
  attend = ea.make_attention_fn('softmax_chunked', implementation='pallas', scale=SCALE)
  got = attend(q, k, v, is_causal=True)
  assert calls == [(True, SCALE)]
  n = q.shape[1]
  np.testing.assert_allclose(
    got, np_masked_attention(q, k, v, np.tril(np.ones((n, n), bool)), scale=SCALE), atol=2e-5
  )
  with pytest.raises(ValueError, match="'pallas' cannot run this call: the GPU kernel takes no"):
    attend(q, k, v, mask=np.ones((2, 1, 1, n), bool))

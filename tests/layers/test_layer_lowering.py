"""Linen and NNX layers with implementation='pallas' lower to the real kernels for a GPU
(Triton) and a TPU (Mosaic) from this CPU host (issue 67): the layer's forward and its
gradients for the parameters and the input, exported with `jax.export` for each platform,
hold the kernels' custom calls (`lowering.problems`), so an interpreted fallback fails.
The kernels alone: tests/ops/test_kernel_lowering.py.
"""

import functools

from flax import nnx
import jax
import lowering
import pytest

import efficient_attn as ea
import efficient_attn.nnx as ean
from efficient_attn.ops import fused_softmax

PLATFORMS = ('cuda', 'tpu')
LENGTH = 2 * lowering.CHUNK  # two chunks: the state is carried once
HEADS, HEAD_DIM = 2, 64
RECURRENCES = ('retention', 'mamba2', 'gla', 'deltanet', 'gated_deltanet')
# One NNX layer per kernel (scalar decay, vector decay, delta): NNX wraps the same core.
NNX_RECURRENCES = ('retention', 'gla', 'gated_deltanet')


def _layer_kwargs(mechanism):
  return dict(
    mechanism=mechanism,
    causal=ea.get_mechanism(mechanism).causal_only,
    options={'implementation': 'pallas'},
  )


@functools.cache
def _linen(mechanism, length=LENGTH):
  """(jitted (params, x) -> (out, grads), abstract (params, x)) of a Linen layer."""
  x = lowering.sds((1, length, HEADS * HEAD_DIM))
  layer = ea.MultiHeadAttention(num_heads=HEADS, **_layer_kwargs(mechanism))
  params = jax.eval_shape(layer.init, jax.random.key(0), x)
  return lowering.jit_forward_and_grads(layer.apply, argnums=(0, 1)), (params, x)


@functools.cache
def _nnx(mechanism):
  """As `_linen`, of the NNX layer (its state as the parameters)."""
  layer = nnx.eval_shape(
    lambda: ean.MultiHeadAttention(
      HEADS, HEADS * HEAD_DIM, rngs=nnx.Rngs(0), **_layer_kwargs(mechanism)
    )
  )
  graphdef, state = nnx.split(layer)
  apply = lambda state, x: nnx.merge(graphdef, state)(x)
  x = lowering.sds((1, LENGTH, HEADS * HEAD_DIM))
  return lowering.jit_forward_and_grads(apply, argnums=(0, 1)), (state, x)


@pytest.mark.parametrize('platform', PLATFORMS)
def test_recurrent_layers_with_implementation_pallas_lower_to_the_kernels(platform):
  """Linen, each of the five recurrences, and NNX, one per kernel: 3 kernel calls at least
  (the forward, the forward keeping residuals, the backward)."""
  cases = [(f'linen {m}', *_linen(m)) for m in RECURRENCES]
  cases += [(f'nnx {m}', *_nnx(m)) for m in NNX_RECURRENCES]
  problems = []
  for case, jitted, args in cases:
    text = lowering.export_text(jitted, platform, *args)
    problems += lowering.problems(case, text, platform, want=3)
  assert not problems, '\n'.join(problems)


SOFTMAX_LENGTH = 256  # splash attention takes multiples of 128
BACKEND = {'cuda': 'gpu', 'tpu': 'tpu'}  # JAX's backend name of each platform


@pytest.mark.parametrize('platform', PLATFORMS)
def test_softmax_layer_with_implementation_pallas_lowers_to_the_kernel(platform, monkeypatch):
  """The Linen softmax layer with implementation='pallas', traced as on that platform's host:
  `fused_softmax` picks its kernel by the host's backend when tracing (a CPU host refuses
  'pallas'), so the host is faked. 2 kernel calls at least (forward and backward)."""
  monkeypatch.setattr(fused_softmax, 'platform', lambda: BACKEND[platform])
  jitted, args = _linen.__wrapped__('softmax', SOFTMAX_LENGTH)  # not cached: faked host
  text = lowering.export_text(jitted, platform, *args)
  problems = lowering.problems('linen softmax', text, platform, want=2)
  assert not problems, '\n'.join(problems)

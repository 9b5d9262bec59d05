"""The plain mechanism functions check their keyword values against the Options.

A bound is written once, in the mechanism's `registry.Option`; the plain function
raises the same one-line error (`registry.check_arguments`), naming the function,
the value and what is allowed.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from efficient_attn import registry
from efficient_attn.mechanisms import bigbird
from efficient_attn.mechanisms import local
from efficient_attn.mechanisms import longformer
from efficient_attn.mechanisms import nystrom
from efficient_attn.mechanisms import sinkhorn
from efficient_attn.mechanisms import softmax
from efficient_attn.mechanisms import sparse
from efficient_attn.mechanisms import synthesizer

Q = jnp.zeros((1, 8, 1, 2))

CASES = [
  (
    lambda: nystrom.nystrom_attention(Q, Q, Q, 0),
    'nystrom_attention: num_landmarks=0 is not valid; it must be an int >= 1',
  ),
  (
    lambda: longformer.longformer_attention(Q, Q, Q, window=0),
    'longformer_attention: window=0 is not valid; it must be an int >= 1',
  ),
  (
    lambda: longformer.longformer_attention(Q, Q, Q, global_tokens=-1),
    'longformer_attention: global_tokens=-1 is not valid; it must be an int >= 0',
  ),
  (
    lambda: local.local_attention(Q, Q, Q, window=2, block_size=0),
    'local attention (band_blocks): block_size=0 is not valid; it must be an int >= 1 or None',
  ),
  (
    lambda: bigbird.bigbird_attention(Q, Q, Q, block_size=0),
    'bigbird_attention: block_size=0 is not valid; it must be an int >= 1',
  ),
  (
    lambda: bigbird.bigbird_attention(Q, Q, Q, block_size=4, num_random_blocks=-1),
    'bigbird_attention: num_random_blocks=-1 is not valid; it must be an int >= 0',
  ),
  (
    lambda: sparse.sparse_attention(Q, Q, Q, pattern='dense'),
    "sparse_attention: pattern='dense' is not valid; it must be one of 'strided', 'fixed'",
  ),
  (
    lambda: softmax.chunked_softmax_attention(Q, Q, Q, k_chunk=0),
    'chunked_softmax_attention: k_chunk=0 is not valid; it must be an int >= 1',
  ),
  (
    lambda: sinkhorn.param_specs(
      heads=1, head_dim=2, max_length=8, block_size=4, sort_hidden_dim=0
    ),
    'Sinkhorn param_specs: sort_hidden_dim=0 is not valid; it must be an int >= 1 or None',
  ),
  (
    lambda: synthesizer.param_specs(
      heads=1, head_dim=2, max_length=8, kind='factorized_random', factor_rank=0
    ),
    'Synthesizer param_specs: factor_rank=0 is not valid; it must be an int >= 1',
  ),
]


@pytest.mark.parametrize('call,message', CASES)
def test_plain_functions_raise_the_declared_bound(call, message):
  with pytest.raises(ValueError) as info:
    call()
  assert str(info.value) == message


def test_check_arguments_checks_the_range_not_the_type():
  registry.check_arguments('nystrom', 'f', num_landmarks=np.int64(3), conv_kernel_size=None)
  with pytest.raises(
    ValueError,
    match=r'^f: num_landmarks=0 is not valid; it must be an '
    r'int >= 1$',
  ):
    registry.check_arguments('nystrom', 'f', num_landmarks=0)
  with pytest.raises(ValueError, match=r'^f: num_landmarks=None is not valid'):
    registry.check_arguments('nystrom', 'f', num_landmarks=None)


def test_options_outside_the_chosen_branch_are_not_checked():
  """factor_rank only matters for 'factorized_random' (as before the checks moved)."""
  specs = synthesizer.param_specs(
    heads=1, head_dim=2, max_length=8, kind='dense', factor_rank=0, factor_a=0
  )
  assert 'dense_w1' in specs


@pytest.mark.parametrize('value', [float('nan'), float('inf'), float('-inf')])
def test_a_float_option_refuses_a_value_that_is_not_finite(value):
  """NaN passes every comparison with a bound, so it needs its own check (it would train
  until the first non-finite loss)."""
  with pytest.raises(
    ValueError,
    match=r"option dt_max=.* of mechanism 'mamba2' is not valid; "
    r'it must be a finite float > 0',
  ):
    registry.get_mechanism('mamba2').resolve({'dt_max': value})

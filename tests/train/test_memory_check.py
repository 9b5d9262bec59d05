"""`train/memory_check.py`: a run whose n x n weights cannot fit in the host's memory is
refused in one line before any data or workdir is written; its bound is below XLA's own."""

import jax
import jax.numpy as jnp
import pytest
import shared_runs

from efficient_attn import registry
from efficient_attn.models import Encoder
from efficient_attn.models import TransformerConfig
from train import memory_check
from train import session as session_lib
from train import validate

GIB = 2**30


def test_a_sequence_too_long_for_memory_is_refused_before_its_data(tmp_path, monkeypatch):
  monkeypatch.setattr(memory_check, 'host_bytes', lambda: 24 * GIB)
  data_dir = tmp_path / 'data'
  config = shared_runs.parse_mqar(
    f'--config.dataset.data_dir={data_dir}', arg='softmax,seq_len=16384'
  )
  with pytest.raises(validate.ConfigError) as e:
    session_lib.Session(config)
  message = str(e.value)
  assert '\n' not in message
  # 2 layers x batch 64 x 2 heads x 16384^2 x 4 bytes = 256 GiB; evaluation at 250: 500 GiB
  assert 'needs at least 500.0 GiB' in message and 'over the 24.0 GiB' in message, message
  assert 'softmax_chunked' in message and 'eval_batch_size' in message, message
  assert not data_dir.exists()


def test_what_fits_passes_and_what_forms_no_weights_is_not_counted(monkeypatch):
  monkeypatch.setattr(memory_check, 'host_bytes', lambda: 24 * GIB)
  config = shared_runs.parse_mqar(arg='softmax,seq_len=16384')
  softmax, linear = registry.get_mechanism('softmax'), registry.get_mechanism('linear')
  assert memory_check.check(config, (softmax,), 16384) is not None
  assert memory_check.check(config, (softmax,), 2048) is None  # 7.8 GiB
  assert memory_check.check(config, (linear,), 16384) is None
  # A pattern counts its quadratic blocks only: 'linear+softmax' over 2 blocks is one.
  assert memory_check.weights_bytes(1, batch=64, eval_batch=8, heads=2, length=1024) == GIB // 2
  assert memory_check.weights_bytes(0, batch=64, eval_batch=8, heads=2, length=1024) == 0
  config.model.reversible = True  # one block's weights at a time
  config.dataset.eval_batch_size = 1
  assert 'needs at least 128.0 GiB' in memory_check.check(config, (softmax,), 16384)


def test_the_bound_is_below_what_xla_allocates():
  """The lower bound (one [batch, heads, n, n] float32 array per layer) against the
  compiler's temporary memory for a softmax encoder's gradient."""
  depth, batch, heads, n = 2, 2, 2, 256
  model = Encoder(
    TransformerConfig(d_model=16, depth=depth, num_heads=heads, mlp_dim=32, mechanism='softmax')
  )
  x = jnp.ones((batch, n, 16))
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  grad = jax.jit(jax.grad(lambda p, x: jnp.sum(model.apply(p, x) ** 2)))
  temp = grad.lower(params, x).compile().memory_analysis().temp_size_in_bytes
  bound = memory_check.weights_bytes(depth, batch=batch, eval_batch=batch, heads=heads, length=n)
  assert bound <= temp, (bound, temp)

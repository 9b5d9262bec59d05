"""A tiny end-to-end run of `benchmarks.generation` writes valid JSON, markdown and PNGs."""

import json
import os

import flax.serialization
import jax
import jax.numpy as jnp
import pytest

from benchmarks import common
from benchmarks import generation

ARGS = [
  '--num_images=2,3',
  '--image_size=4',
  '--d_model=8',
  '--depth=1',
  '--num_heads=2',
  '--mlp_dim=16',
  '--quiet',
]


@pytest.mark.slow
def test_tiny_run_writes_outputs(tmp_path):
  out = str(tmp_path)
  generation.main(ARGS + [f'--out={out}', '--option=linear.feature_map=relu', '--num_kv_heads=0,1'])
  with open(os.path.join(out, 'generation.json')) as f:
    result = json.load(f)
  assert (
    result['mechanisms'] == ['linear', 'linear (kv heads 1)', 'softmax', 'softmax (kv heads 1)']
    and result['length'] == 16
  )
  for mech in ('linear', 'softmax'):  # grouped-query attention halves the decoding state
    grouped = result['cache_bytes'][f'{mech} (kv heads 1)']
    assert 0.5 * result['cache_bytes'][mech] <= grouped < 0.55 * result['cache_bytes'][mech]
    assert result['params'][f'{mech} (kv heads 1)'] < result['params'][mech]
    assert set(result['wall'][mech]) == {'2', '3'}
    assert all(p['time_s'] > 0 for p in result['wall'][mech].values())
    assert len(result['latency'][mech]['times_s']) == 16
  with open(os.path.join(out, 'generation.md')) as f:
    text = f.read()
  assert '| images | linear (s) | linear (kv heads 1) (s) | softmax (s) |' in text
  assert '| softmax (kv heads 1) |' in text and 'Decoding state per image' in text
  assert '\n| 3 |' in text and 'Per-step latency' in text
  for name in ('generation_latency.png', 'generation_wall.png'):
    with open(os.path.join(out, name), 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_params_from_a_file(tmp_path):
  args = common.parse_flags(generation.define_flags, ARGS + ['--mechanisms=linear'])
  model = generation.build_model(args, 'linear', {})
  params = generation.load_params(model, '', seed=1)
  params = jax.tree.map(lambda p: p + 1.0, params)
  path = tmp_path / 'params.msgpack'
  path.write_bytes(flax.serialization.to_bytes(params))
  loaded = generation.load_params(model, str(path), seed=0)
  assert jax.tree.all(jax.tree.map(jnp.array_equal, loaded, params))


@pytest.mark.slow
def test_a_gated_mechanism_beside_linear_gets_its_own_weights(tmp_path):
  """GLA's gate projections are parameters linear lacks: it used to be given linear's
  weights and stop with ScopeParamNotFoundError; now it draws its own, linear keeps its."""
  result = generation.main(
    ARGS + [f'--out={tmp_path}', '--num_images=2', '--mechanisms=gla,linear']
  )
  assert result['params']['gla'] > result['params']['linear']
  assert all(len(result['latency'][m]['times_s']) == 16 for m in ('gla', 'linear'))

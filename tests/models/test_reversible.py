"""Reversible residual layers: the same gradients as autodiff, memory flat in depth."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import xla_stats
from efficient_attn.models import reversible
from efficient_attn.models.transformer import Encoder
from efficient_attn.models.transformer import TransformerConfig

X = jax.random.normal(jax.random.key(0), (2, 16, 16))


def _config(**changes):
  return TransformerConfig(d_model=16, depth=3, num_heads=2, mlp_dim=32, reversible=True).replace(
    **changes
  )


def _loss(model, rngs=None):
  def loss(params, x):
    y = model.apply({'params': params}, x, deterministic=rngs is None, rngs=rngs)
    return jnp.sum(jnp.sin(y) * jnp.arange(y.shape[-1]))

  return loss


@pytest.mark.parametrize(
  'changes',
  [
    dict(),
    dict(
      mechanism='linformer', options={'sharing': 'layerwise', 'k_proj': 8}, max_length=16
    ),  # shared parameters
    dict(dropout_rate=0.2, attention_dropout_rate=0.1),  # random draws, recomputed alike
  ],
)
def test_gradients_equal_autodiff_of_the_same_stack(changes):
  """The custom backward (inputs recomputed from outputs) against jax.grad of the plain
  forward of the same blocks (`_stack.fun`, no custom rule), with the same rng keys."""
  c = _config(**changes)
  model = Encoder(c)
  params = model.init(jax.random.key(1), X)['params']
  rngs = {'dropout': jax.random.key(2)} if c.dropout_rate else None
  got = jax.jit(jax.grad(_loss(model, rngs), argnums=(0, 1)))(params, X)
  with _without_custom_rule():  # traced inside: a separate compiled function
    want = jax.jit(jax.grad(_loss(model, rngs), argnums=(0, 1)))(params, X)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  leaves = list(zip(jax.tree.leaves(got), jax.tree.leaves(want)))
  assert len(leaves) > 10
  for a, b in leaves:
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
  assert any(float(jnp.abs(a).max()) > 0 for a, _ in leaves)


class _without_custom_rule:
  """Swaps the custom-VJP stack for its plain forward (autodiff stores every activation)."""

  def __enter__(self):
    self._saved = reversible._stack
    reversible._stack = reversible._stack.fun

  def __exit__(self, *exc):
    reversible._stack = self._saved


def test_same_parameter_count_and_forward_shape_as_the_ordinary_stack():
  rev = Encoder(_config()).init(jax.random.key(1), X)['params']
  plain = Encoder(_config(reversible=False)).init(jax.random.key(1), X)['params']
  count = lambda p: sum(x.size for x in jax.tree.leaves(p))
  assert count(rev) == count(plain)
  assert Encoder(_config()).apply({'params': rev}, X).shape == X.shape


def _temp_bytes(depth: int, reversible_stack: bool) -> int:
  c = _config(depth=depth, reversible=reversible_stack, d_model=32, mlp_dim=64)
  model = Encoder(c)
  x = jnp.zeros((4, 256, 32))
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), x))['params']
  compiled = jax.jit(jax.grad(_loss(model))).lower(params, x).compile()
  return xla_stats.memory(compiled)['temp']


def test_activation_memory_is_flat_in_depth():
  """XLA's temporary memory of a gradient step at depth 2, 4, 8: the ordinary stack stores
  every block's activations, the reversible one only one block's."""
  plain = [_temp_bytes(d, False) for d in (2, 4, 8)]
  rev = [_temp_bytes(d, True) for d in (2, 4, 8)]
  assert plain[2] > 2.5 * plain[0], plain
  assert rev[2] < 1.3 * rev[0], rev
  assert rev[2] < plain[2] / 2, (rev, plain)


def test_decoding_is_refused():
  c = _config(causal=True, decode=True)
  with pytest.raises(ValueError, match='decode=True.*ordinary stack'):
    Encoder(c).init(jax.random.key(0), X[:, :1])


def test_model_reversible_from_a_config():
  from configs import default  # pylint: disable=g-import-not-at-top
  from configs import digits_pixels  # pylint: disable=g-import-not-at-top
  from train import modeling  # pylint: disable=g-import-not-at-top
  from train import validate  # pylint: disable=g-import-not-at-top

  config = default.get_config()
  config.model.reversible = True
  config = validate.resolved(config, read_data=False)
  params = jax.eval_shape(
    lambda: modeling.create_model(config).init(
      jax.random.key(0), modeling.dummy_inputs(config), train=False
    )
  )['params']
  assert 'block_0_attention' in params['encoder']['reversible']
  config = digits_pixels.get_config('linear')
  config.model.reversible = True
  with pytest.raises(
    validate.ConfigError,
    match=r"reversible=True is not valid for "
    r"config.model.kind='causal'.*valid kinds: vit, text",
  ):
    validate.resolved(config, read_data=False)

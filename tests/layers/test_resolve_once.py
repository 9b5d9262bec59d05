"""The mechanism is resolved once: one registry look-up per model, one configure per layer.

The model's `Encoder` resolves the mechanism (`registry.configure`) and hands
every block the declaration and resolved options; each attention layer
configures its mechanism once, when it is constructed (its `Mechanism`
module), and its forward, cache and decoding step read that. A model handed its
mechanisms configured already (`hybrid.Stack`, as the trainer does) configures them
in its layers alone.
"""

import collections

from flax import nnx
import jax
import jax.numpy as jnp
import pytest

import efficient_attn as ea
from efficient_attn import models
from efficient_attn import registry
from efficient_attn.layers import hybrid
import efficient_attn.nnx as ean

DEPTH = 2


@pytest.fixture
def counts(monkeypatch):
  """Calls of registry.get_mechanism (a look-up by name) and registry.configure."""
  registry.list_mechanisms()  # load every mechanism first
  seen = collections.Counter()

  def counting(name, fn):
    def counted(*args, **kwargs):
      seen[name] += 1
      return fn(*args, **kwargs)

    return counted

  for name in ('get_mechanism', 'configure'):
    monkeypatch.setattr(registry, name, counting(name, getattr(registry, name)))
  return seen


def _config(mechanism, **changes):
  return models.TransformerConfig(
    d_model=16, depth=DEPTH, num_heads=2, mlp_dim=16, mechanism=mechanism, **changes
  )


def test_vit_init_and_apply_look_the_mechanism_up_once(counts):
  vit = models.ViT(_config('nystrom', options={'num_landmarks': 4}), num_classes=3, patch_size=4)
  x = jnp.zeros((1, 8, 8, 1))
  variables = jax.eval_shape(vit.init, jax.random.key(0), x)
  assert counts == {'get_mechanism': 1, 'configure': 1 + DEPTH}  # the Encoder, each layer
  counts.clear()
  jax.eval_shape(vit.apply, variables, x)
  assert counts == {'get_mechanism': 1, 'configure': 1 + DEPTH}


def test_a_decoding_step_looks_the_mechanism_up_once(counts):
  model = models.CausalTransformer(_config('linear', max_length=8), vocab_size=5, decode=True)
  tokens = jnp.zeros((1, 8), jnp.int32)
  variables = jax.eval_shape(model.init, jax.random.key(0), tokens)
  counts.clear()
  jax.eval_shape(lambda v: model.apply(v, tokens[:, :1], mutable=['cache']), variables)
  assert counts == {'get_mechanism': 1, 'configure': 1 + DEPTH}


def test_a_model_handed_a_configured_stack_configures_it_in_its_layers_alone(counts):
  stack = hybrid.Stack(hybrid.configure('linear+local', {'window': 4}, causal=True))
  counts.clear()
  model = models.CausalTransformer(_config(stack, max_length=8), vocab_size=5)
  tokens = jnp.zeros((1, 8), jnp.int32)
  variables = jax.eval_shape(model.init, jax.random.key(0), tokens)
  assert counts == {'configure': DEPTH}  # no look-up, nor the Encoder's configure
  by_name = models.CausalTransformer(
    _config('linear+local', options={'window': 4}, max_length=8), vocab_size=5
  )
  assert jax.tree.map(lambda x: x.shape, variables) == jax.tree.map(
    lambda x: x.shape, jax.eval_shape(by_name.init, jax.random.key(0), tokens)
  )


def test_a_layer_alone_looks_its_mechanism_up_once(counts):
  x = jnp.zeros((1, 8, 16))
  layer = ea.MultiHeadAttention(num_heads=2, mechanism='nystrom', options={'num_landmarks': 4})
  variables = jax.eval_shape(layer.init, jax.random.key(0), x)
  assert counts == {'get_mechanism': 1, 'configure': 1}
  counts.clear()
  nnx_layer = ean.MultiHeadAttention(
    2, 16, mechanism='nystrom', options={'num_landmarks': 4}, rngs=nnx.Rngs(0)
  )
  nnx_layer(x)
  assert counts == {'get_mechanism': 1, 'configure': 1}
  del variables

"""LoRA adapters (`efficient_attn.layers.lora`) and the transformed data (`data.transforms`)."""

import functools

from flax import traverse_util
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from data import transforms
from efficient_attn.layers import lora
from efficient_attn.models import CausalTransformer
from efficient_attn.models import TransformerConfig

CFG = lora.LoraConfig(rank=2, alpha=4.0)


@functools.lru_cache(maxsize=None)
def _model():
  model = CausalTransformer(
    TransformerConfig(
      max_length=8, d_model=16, depth=1, num_heads=2, mlp_dim=32, mechanism='softmax'
    )
  )
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 8), 0, 256)
  base = jax.jit(model.init)(jax.random.PRNGKey(1), tokens)['params']
  params = jax.jit(lora.wrap(model.init, CFG))(jax.random.PRNGKey(2), tokens)['params']
  return model, tokens, base, lora.load_base(params, base)


def _apply(model, params, tokens, config=None):
  return jax.jit(lora.wrap(model.apply, config))({'params': params}, tokens)


def _perturb_adapters(params, seed=0):
  flat = traverse_util.flatten_dict(params)
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), len(flat)))
  return traverse_util.unflatten_dict(
    {
      p: v + 0.3 * jax.random.normal(next(keys), v.shape) if lora.is_adapter(p) else v
      for p, v in flat.items()
    }
  )


def test_adapters_on_attention_and_mlp_only():
  _, _, base, params = _model()
  _, adapters = lora.split(params)
  adapted = {'/'.join(p[:-1]) for p in traverse_util.flatten_dict(adapters)}
  expected = {
    f'decoder/block_{i}/{m}'
    for i in range(1)
    for m in (
      'attention/query',
      'attention/key',
      'attention/value',
      'attention/out',
      'mlp/Dense_0',
      'mlp/Dense_1',
    )
  }
  assert adapted == expected
  assert jax.tree.structure(lora.split(params)[0]) == jax.tree.structure(base)


def test_adapted_module_has_the_same_params_and_paths():
  model, tokens, _, params = _model()
  wrapped = jax.eval_shape(lora.Adapted(model, CFG).init, jax.random.PRNGKey(2), tokens)
  assert jax.tree.structure(wrapped['params']) == jax.tree.structure(params)
  assert lora.is_adapter('decoder/block_0/mlp/Dense_0/lora_b')
  assert not lora.is_adapter('decoder/block_0/mlp/Dense_0/kernel')


def test_adapted_equals_base_at_init():
  model, tokens, base, params = _model()
  np.testing.assert_array_equal(_apply(model, params, tokens, CFG), _apply(model, base, tokens))


def test_merged_equals_adapter_form():
  model, tokens, base, params = _model()
  params = _perturb_adapters(params)
  adapted = _apply(model, params, tokens, CFG)
  merged = lora.merge(params, scale=CFG.scale)
  assert jax.tree.structure(merged) == jax.tree.structure(base)
  out = _apply(model, merged, tokens)
  assert np.abs(out - _apply(model, base, tokens)).max() > 1e-2  # adapters matter
  np.testing.assert_allclose(out, adapted, atol=1e-4, rtol=1e-4)
  base_part, adapters = lora.split(params)
  np.testing.assert_allclose(
    _apply(model, lora.merge(base_part, adapters, scale=CFG.scale), tokens),
    adapted,
    atol=1e-4,
    rtol=1e-4,
  )


def test_optimizer_step_changes_only_adapters():
  model, tokens, _, params = _model()
  tx = lora.optimizer(optax.adam(1e-2), params)
  state = tx.init(params)

  def loss(p):
    logits = lora.wrap(model.apply, CFG)({'params': p}, tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

  grads = jax.jit(jax.grad(loss))(params)
  updates, _ = tx.update(grads, state, params)
  old = traverse_util.flatten_dict(params)
  new = traverse_util.flatten_dict(optax.apply_updates(params, updates))
  assert old.keys() == new.keys()
  changed = {p for p in old if not np.array_equal(old[p], new[p])}
  assert changed and all(lora.is_adapter(p) for p in changed)
  assert {p[-1] for p in changed} == {lora.B_NAME}  # B starts at 0, so dL/dA = 0 at step 1
  mask = traverse_util.flatten_dict(lora.trainable_mask(params))
  assert all(mask[p] for p in changed) and sum(mask.values()) == 12


def test_trainable_count_matches_report_formula():
  """The report's base MLP 784-64-64-10 (55.1K params) with rank r adds 1050 r (1.1K .. 67.2K)."""

  class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.Dense(64)(x))
      x = nn.relu(nn.Dense(64)(x))
      return nn.Dense(10)(x)

  x = jnp.zeros((1, 784))
  for r in (1, 2, 4, 8, 16, 32, 64):
    with lora.adapted(lora.LoraConfig(rank=r, targets=lora.ALL_DENSE)):
      params = jax.eval_shape(Mlp().init, jax.random.PRNGKey(0), x)['params']
    trainable = lora.count_params(params, trainable_only=True)
    assert (
      trainable
      == sum(lora.adapter_size(i, fan_out, r) for i, fan_out in ((784, 64), (64, 64), (64, 10)))
      == 1050 * r
    )
    assert lora.count_params(params) - trainable == 55_050


def test_targets_select_by_path_and_load_base_checks_shapes():
  model, tokens, base, _ = _model()
  cfg = lora.LoraConfig(rank=3, targets=(r'attention/query$',))
  params = jax.eval_shape(lora.wrap(model.init, cfg), jax.random.PRNGKey(0), tokens)['params']
  assert lora.count_params(params, trainable_only=True) == 3 * (16 + 16)
  bad = jax.tree.map(lambda x: x, base)
  bad['logits'] = {'kernel': jnp.zeros((3, 3)), 'bias': bad['logits']['bias']}
  with pytest.raises(ValueError, match='shape mismatch'):
    lora.load_base(params, bad)
  with pytest.raises(ValueError, match='rank must be >= 1'):
    lora.LoraConfig(rank=0)


def test_data_transforms():
  x = np.random.RandomState(0).randint(0, 256, (3, 5, 5)).astype(np.uint8)
  np.testing.assert_array_equal(transforms.rotate(x, 90), np.rot90(x, axes=(1, 2)))
  np.testing.assert_allclose(
    transforms.rotate(x.astype(np.float32), 90.0001), np.rot90(x, axes=(1, 2)), atol=0.1
  )
  np.testing.assert_array_equal(transforms.invert(x), 255 - x)
  np.testing.assert_allclose(transforms.invert(x / 255.0), 1 - x / 255.0, atol=1e-6)
  q = np.asarray(transforms.quantise(x, 2))
  assert set(np.unique(q)) <= {0, 255} and q.dtype == np.uint8
  np.testing.assert_array_equal(q, np.where(x >= 128, 255, 0))
  assert len(np.unique(transforms.quantise(x, 4))) <= 4
  chained = transforms.get_transform('rotate:180,invert')(x[..., None])
  np.testing.assert_array_equal(chained[..., 0], 255 - x[:, ::-1, ::-1])
  np.testing.assert_array_equal(transforms.get_transform('none')(x), x)
  assert set(transforms.VARIANTS) == {'mnist', 'rotated', 'inverted', 'quantised'}
  with pytest.raises(ValueError, match='unknown transform.*rotate.*invert.*quantise'):
    transforms.get_transform('blur')

"""LoRA (Hu et al. 2021): low-rank adapters for Dense / DenseGeneral layers.

An adapted layer computes y = x W + b + (alpha / r) x A B, with A `[in, r]`
random and B `[r, out]` zero, so the adapted model starts equal to the base.
`in` / `out` are the flattened contracted / feature dimensions, which covers
the attention projections (query/key/value: `[d, (heads, head_dim)]`; out:
`[(heads, head_dim), d]`) as well as plain Dense layers.

    cfg = lora.LoraConfig(rank=4)                    # attention + MLP Dense layers
    with lora.adapted(cfg):
      params = model.init(rng, x)['params']          # base leaves + 'lora_a' / 'lora_b'
      params = lora.load_base(params, base_params)   # fine-tune a trained model
      tx = lora.optimizer(optax.adam(1e-3))          # base frozen (set_to_zero)
      y = model.apply({'params': params}, x)
    merged = lora.merge(params, scale=cfg.scale)     # plain model, no interceptor
    adapted_model = lora.Adapted(model, cfg)         # the same, as a Linen module

Why an interceptor (`nn.intercept_methods`): it adapts any Flax model without
touching its code (ViT, text, causal, a user's own model, or
`nn.MultiHeadDotProductAttention`), picks layers by module path, and puts A and
B next to the kernel they adapt in the ordinary 'params' tree. So a base
checkpoint is a sub-tree of the adapted params (`load_base`), the trainable mask
is a rule on leaf names, a trainer keeps differentiating 'params' only, and
`merge` is a tree map. An `attention_cls` hook would cover attention only, and
a separate variable collection would need every trainer to differentiate it.
"""

import contextlib
import dataclasses
import math
import re
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from flax import traverse_util
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

#: The names of an adapted kernel's two factors beside it in 'params': A `[in, r]`, B `[r, out]`.
A_NAME, B_NAME = 'lora_a', 'lora_b'
#: `LoraConfig.targets` of the attention projections (query, key, value, out).
ATTENTION_TARGETS = (r'(^|/)attention/(query|key|value|out)$',)
#: `LoraConfig.targets` of the shared encoder's MLP Dense layers.
MLP_TARGETS = (r'(^|/)mlp/Dense_\d+$',)
#: `LoraConfig`'s default targets: the attention projections and the MLP layers.
DEFAULT_TARGETS = ATTENTION_TARGETS + MLP_TARGETS
#: `LoraConfig.targets` that adapt every Dense / DenseGeneral layer.
ALL_DENSE = (r'.*',)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Which layers get adapters, and their rank.

  Attributes:
    rank: r >= 1.
    alpha: the adapter output is scaled by alpha / r (None: alpha = r, scale 1).
    targets: regular expressions, each searched for (`re.search`) in the '/'-joined
      module path of each Dense / DenseGeneral (e.g. 'encoder/block_0/attention/query'); a
      layer matching any of them is adapted. Defaults: attention projections
      (query, key, value, out) and the MLP Dense layers of the shared encoder.
  """

  rank: int
  alpha: Optional[float] = None
  targets: Tuple[str, ...] = DEFAULT_TARGETS

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f'LoRA rank must be >= 1, got {self.rank}')
    object.__setattr__(self, 'targets', tuple(self.targets))

  @property
  def scale(self) -> float:
    return 1.0 if self.alpha is None else self.alpha / self.rank

  def matches(self, path: Sequence[str]) -> bool:
    name = '/'.join(path)
    return any(re.search(t, name) for t in self.targets)


def _contracted_axes(module, ndim: int) -> Tuple[int, ...]:
  if isinstance(module, nn.Dense):
    return (ndim - 1,)
  if getattr(module, 'batch_dims', ()):
    raise ValueError(
      f'LoRA does not support DenseGeneral with batch_dims ({"/".join(module.path)})'
    )
  axis = module.axis if isinstance(module.axis, Sequence) else (module.axis,)
  return tuple(a % ndim for a in axis)


def low_rank_delta(
  x: jnp.ndarray, a: jnp.ndarray, b: jnp.ndarray, axes: Tuple[int, ...], out_shape: Tuple[int, ...]
) -> jnp.ndarray:
  """(x A) B with x's `axes` contracted: `[..., *in] -> [..., *out_shape]`.

  a `[prod(in), r]`, b `[r, prod(out_shape)]`; the contracted axes are
  flattened in the order given, matching a DenseGeneral kernel `[*in, *out]`.
  """
  k = len(axes)
  x = jnp.moveaxis(x, axes, tuple(range(x.ndim - k, x.ndim)))
  x = x.reshape(x.shape[: x.ndim - k] + (-1,))
  y = (x @ a) @ b
  return y.reshape(y.shape[:-1] + tuple(out_shape))


def interceptor(config: LoraConfig) -> Callable[..., Any]:
  """A `nn.intercept_methods` interceptor adding adapters to matching layers."""

  def intercept(next_fun, args, kwargs, context):
    module = context.module
    if (
      context.method_name != '__call__'
      or not isinstance(module, (nn.Dense, nn.DenseGeneral))
      or not config.matches(module.path)
    ):
      return next_fun(*args, **kwargs)
    y = next_fun(*args, **kwargs)
    x = args[0] if args else kwargs['inputs']
    axes = _contracted_axes(module, x.ndim)
    out_shape = y.shape[x.ndim - len(axes) :]
    d_in = math.prod(x.shape[i] for i in axes)
    d_out = math.prod(out_shape)
    a = module.param(
      A_NAME,
      nn.initializers.variance_scaling(1.0, 'fan_in', 'normal'),
      (d_in, config.rank),
      module.param_dtype,
    )
    b = module.param(B_NAME, nn.initializers.zeros_init(), (config.rank, d_out), module.param_dtype)
    dtype = module.dtype or y.dtype
    delta = low_rank_delta(x.astype(dtype), a.astype(dtype), b.astype(dtype), axes, out_shape)
    return y + (config.scale * delta).astype(y.dtype)

  return intercept


@contextlib.contextmanager
def adapted(config: Optional[LoraConfig]):
  """Context in which Flax models' matching Dense layers carry adapters (None: off)."""
  if config is None:
    yield
    return
  with nn.intercept_methods(interceptor(config)):
    yield


def wrap(fn: Callable[..., Any], config: Optional[LoraConfig]) -> Callable[..., Any]:
  """`fn` (e.g. `model.apply` / `model.init`) run inside `adapted(config)`.

  The interceptor acts while tracing, so jit the wrapped function
  (`jax.jit(wrap(model.apply, cfg))`), not the other way round.
  """

  def wrapped(*args, **kwargs):
    with adapted(config):
      return fn(*args, **kwargs)

  return wrapped


class Adapted(nn.Module):
  """`module` with adapters, as a Module (e.g. for a trainer's `create_model`).

  Shares `module`'s scope (`nn.share_scope`), so the params tree is the one
  `adapted(config)` gives: the base paths unchanged, adapters added.

  Attributes:
    module: the base model.
    config: the `LoraConfig`.
  """

  module: nn.Module
  config: LoraConfig

  def setup(self):
    nn.share_scope(self, self.module)

  def __call__(self, *args, **kwargs):
    with adapted(self.config):
      return self.module(*args, **kwargs)


def is_adapter(path) -> bool:
  """Whether a params path (a tuple of keys, or 'a/b/lora_a') is an adapter leaf."""
  if isinstance(path, str):
    path = path.split('/')
  return bool(path) and str(path[-1]) in (A_NAME, B_NAME)


def split(params) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """params -> (base params, adapters), both nested dicts."""
  flat = traverse_util.flatten_dict(_unfreeze(params))
  base = {p: v for p, v in flat.items() if not is_adapter(p)}
  adapters = {p: v for p, v in flat.items() if is_adapter(p)}
  return traverse_util.unflatten_dict(base), traverse_util.unflatten_dict(adapters)


def combine(base, adapters) -> Dict[str, Any]:
  """Inverse of `split`."""
  flat = traverse_util.flatten_dict(_unfreeze(base))
  flat.update(traverse_util.flatten_dict(_unfreeze(adapters)))
  return traverse_util.unflatten_dict(flat)


def load_base(params, base_params) -> Dict[str, Any]:
  """Adapted params with every base leaf replaced by `base_params`' (init_from).

  Raises ValueError if the trees' base leaves differ in paths or shapes.
  """
  base, adapters = split(params)
  want = traverse_util.flatten_dict(base)
  got = traverse_util.flatten_dict(_unfreeze(base_params))
  missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
  bad = [p for p in set(want) & set(got) if np.shape(want[p]) != np.shape(got[p])]
  if missing or extra or bad:
    raise ValueError(
      f'base params do not fit the model: missing {missing[:5]}, '
      f'unexpected {extra[:5]}, shape mismatch {sorted(bad)[:5]}'
    )
  return combine(base_params, adapters)


def merge(params, adapters=None, *, scale: float = 1.0) -> Dict[str, Any]:
  """Fold adapters into the kernels: W + scale * (A B) reshaped; base structure.

  Args:
    params: adapted params (base + adapter leaves), or base params if `adapters`
      is given separately.
    adapters: optional adapter tree as returned by `split`.
    scale: `LoraConfig.scale` (alpha / r).
  Returns:
    params of the plain (un-intercepted) model; its output equals the adapted one.
  """
  if adapters is not None:
    params = combine(params, adapters)
  base, adapters = split(params)
  flat = traverse_util.flatten_dict(base)
  flat_adapters = traverse_util.flatten_dict(adapters)
  for path, a in flat_adapters.items():
    if path[-1] != A_NAME:
      continue
    b = flat_adapters[path[:-1] + (B_NAME,)]
    kernel = flat[path[:-1] + ('kernel',)]
    delta = (a.astype(jnp.float32) @ b.astype(jnp.float32)).reshape(kernel.shape)
    flat[path[:-1] + ('kernel',)] = (kernel + scale * delta).astype(kernel.dtype)
  return traverse_util.unflatten_dict(flat)


def labels(params) -> Dict[str, Any]:
  """A tree of 'lora' (adapter leaves) / 'frozen' (base leaves)."""
  flat = traverse_util.flatten_dict(_unfreeze(params))
  return traverse_util.unflatten_dict({p: 'lora' if is_adapter(p) else 'frozen' for p in flat})


def trainable_mask(params) -> Dict[str, Any]:
  """A tree of bools, True for adapter leaves (for `optax.masked`)."""
  return jax.tree.map(lambda l: l == 'lora', labels(params))


def optimizer(tx: optax.GradientTransformation, params=None) -> optax.GradientTransformation:
  """`tx` on the adapters, zero updates (and no optimiser state) for the base.

  `params` may be omitted: the adapter leaves are then recognised by name when
  the optimiser state is created.
  """
  return optax.multi_transform(
    {'lora': tx, 'frozen': optax.set_to_zero()}, labels if params is None else labels(params)
  )


def count_params(params, trainable_only: bool = False) -> int:
  """Number of parameters (adapter leaves only if `trainable_only`)."""
  flat = traverse_util.flatten_dict(_unfreeze(params))
  return int(sum(np.size(v) for p, v in flat.items() if is_adapter(p) or not trainable_only))


def adapter_size(in_features: int, out_features: int, rank: int) -> int:
  """r (in + out): the parameters LoRA adds to one `in x out` layer."""
  return rank * (in_features + out_features)


def _unfreeze(tree):
  return tree.unfreeze() if hasattr(tree, 'unfreeze') else dict(tree)

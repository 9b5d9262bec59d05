"""An attention benchmark built from a name: the function, its variables and its inputs.

An attention *target* is a name: 'exact' (`jax.nn.dot_product_attention`), a
registered mechanism ('linear', 'nystrom', ...; core attention on q, k, v
`[batch, length, heads, head_dim]`), or 'mechanism/projection' (a whole
`efficient_attn.MultiHeadAttention` layer on x `[batch, length, heads * head_dim]`).
"""

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

import efficient_attn as ea

EXACT = 'exact'


@dataclasses.dataclass
class Bench:
  """A function, its variables and inputs: `fn(variables, *inputs) -> array`.

  `variables` is a Flax variables dict (possibly empty); its 'params' are
  differentiated in the forward+backward pass together with all inputs.
  """

  label: str
  fn: Callable[..., Any]
  variables: Any
  inputs: Tuple[Any, ...]
  options: Dict[str, Any]

  def forward(self):
    """(function, args) for the forward pass."""
    return self.fn, (self.variables,) + self.inputs

  def forward_backward(self):
    """(function, args): gradient of sum(outputs) w.r.t. params and all inputs."""
    rest = {c: v for c, v in self.variables.items() if c != 'params'}
    params = self.variables.get('params', {})

    def loss(p, *inputs):
      out = self.fn(dict(rest, params=p) if p else rest, *inputs)
      return jnp.sum(out.astype(jnp.float32))

    grad = jax.grad(loss, argnums=tuple(range(1 + len(self.inputs))))
    return grad, (params,) + self.inputs


def random_qkv(seed: int, batch: int, length: int, heads: int, head_dim: int, dtype=jnp.float32):
  """q, k, v `[batch, length, heads, head_dim]`, standard normal."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return tuple(jax.random.normal(k, (batch, length, heads, head_dim), dtype) for k in keys)


def exact_attention(q, k, v, causal: bool = False, implementation: Optional[str] = None):
  """`jax.nn.dot_product_attention` (XLA on CPU unless `implementation` says otherwise)."""
  return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=implementation)


def mechanism_bench(
  name: str,
  q,
  k,
  v,
  *,
  options: Optional[Mapping[str, Any]] = None,
  causal: bool = False,
  seed: int = 0,
  exact_implementation: Optional[str] = None,
) -> Bench:
  """Core attention of mechanism `name` (or 'exact') on q, k, v.

  Fixed-length mechanisms (Linformer) are built with max_length = kv length, and
  causal-only ones (the gated recurrences) causal. Parameters are initialised from
  `seed`. A mechanism whose gates read the layer input (`reads_input`) reads q
  `[batch, length, heads * head_dim]` as that input.
  """
  options = dict(options or {})
  if name == EXACT:
    fn = lambda variables, q, k, v: exact_attention(q, k, v, causal, exact_implementation)
    return Bench(name, fn, {}, (q, k, v), options)
  module = build_mechanism(name, k.shape[1], options, causal)
  inputs = lambda q: (
    {'inputs': q.reshape(q.shape[:2] + (-1,))} if ea.get_mechanism(name).reads_input else {}
  )
  variables = jax.jit(lambda key, q, k, v: module.init(key, q, k, v, **inputs(q)))(
    jax.random.PRNGKey(seed), q, k, v
  )
  fn = lambda variables, q, k, v: module.apply(variables, q, k, v, **inputs(q))
  return Bench(name, fn, dict(variables), (q, k, v), options)


def build_mechanism(
  name: str, length: int, options: Optional[Mapping[str, Any]] = None, causal: bool = False
):
  """The mechanism's Linen module; fixed-length ones are built for `length` tokens, and a
  causal-only one is causal."""
  causal = causal or ea.get_mechanism(name).causal_only
  return ea.mechanism_module(name, causal=causal, max_length=length, options=dict(options or {}))


def layer_bench(
  mechanism: str,
  projection: str,
  x,
  *,
  num_heads: int,
  options: Optional[Mapping[str, Any]] = None,
  causal: bool = False,
  seed: int = 0,
) -> Bench:
  """A whole `MultiHeadAttention(mechanism, projection)` layer on x `[batch, length, d_model]`.

  x may be a `jax.ShapeDtypeStruct`: the variables are then shapes only
  (`jax.eval_shape`), enough to lower, compile and count, without allocating.
  """
  layer = attention_layer(
    mechanism, projection, num_heads=num_heads, length=x.shape[1], options=options, causal=causal
  )
  key = jax.random.PRNGKey(seed)
  if isinstance(x, jax.ShapeDtypeStruct):
    variables = jax.eval_shape(layer.init, key, x)
  else:
    variables = jax.jit(layer.init)(key, x)
  fn = lambda variables, x: layer.apply(variables, x)
  return Bench(f'{mechanism}/{projection}', fn, dict(variables), (x,), dict(options or {}))


def attention_layer(
  mechanism: str,
  projection: str,
  *,
  num_heads: int,
  length: int,
  options: Optional[Mapping[str, Any]] = None,
  causal: bool = False,
):
  """`ea.MultiHeadAttention` with max_length = length (for 'super' and Linformer); a
  causal-only mechanism is causal."""
  causal = causal or ea.get_mechanism(mechanism).causal_only
  return ea.MultiHeadAttention(
    num_heads=num_heads,
    mechanism=mechanism,
    projection=projection,
    options=dict(options or {}) or None,
    causal=causal,
    max_length=length,
  )


def parse_target(target: str) -> Tuple[str, Optional[str]]:
  """'linear/efficient' -> ('linear', 'efficient'); 'linear' -> ('linear', None).

  Raises ValueError listing the valid names for an unknown mechanism or projection.
  """
  mechanism, _, projection = target.partition('/')
  if mechanism != EXACT:
    ea.get_mechanism(mechanism)
  elif projection:
    raise ValueError(f"'{EXACT}' is core attention only, not a layer: {target!r}")
  if projection:
    ea.registry.check_projection(projection)
  return mechanism, projection or None


def available_mechanisms() -> Tuple[str, ...]:
  """Every registered mechanism."""
  return ea.list_mechanisms()


def count_params(tree) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(tree)))


def effective_options(
  mechanism: str, overrides: Optional[Mapping[str, Any]] = None
) -> Dict[str, Any]:
  """The mechanism's options with their values (declared defaults + overrides)."""
  if mechanism == EXACT:
    return dict(overrides or {})
  return dict(
    ea.get_mechanism(mechanism).resolve(
      {k: v for k, v in (overrides or {}).items() if not k.startswith('_')}
    )
  )

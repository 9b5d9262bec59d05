"""Parameters a mechanism owns: spec dicts, their initialisation, a per-head MLP.

A mechanism with learned weights declares them as `ParamSpecs`, `{name: (shape,
init)}` (see `registry.ParamSpec`). Shared by the Synthesizer and Sinkhorn
mechanisms: the per-head 2-layer MLP (`mlp_param_specs`, `per_head_mlp`),
`require_params` and `init_from_specs`.
"""

from typing import Any, Callable, Dict, Tuple

import jax
import jax.numpy as jnp

Initializer = Callable[..., Any]
ParamSpecs = Dict[str, Tuple[Tuple[int, ...], Initializer]]

# Per-head weight matrices `[heads, fan_in, fan_out]`: heads is a batch axis.
_KERNEL_INIT = jax.nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
_BIAS_INIT = jax.nn.initializers.zeros


def mlp_param_specs(prefix: str, heads: int, d_in: int, hidden: int, d_out: int) -> ParamSpecs:
  """Specs of a per-head 2-layer MLP d_in -> hidden -> d_out, named `prefix`_w1 .. _b2.

  Weights `[heads, fan_in, fan_out]` are LeCun-normal (heads a batch axis),
  biases `[heads, fan_out]` zero.
  """
  return {
    f'{prefix}_w1': ((heads, d_in, hidden), _KERNEL_INIT),
    f'{prefix}_b1': ((heads, hidden), _BIAS_INIT),
    f'{prefix}_w2': ((heads, hidden, d_out), _KERNEL_INIT),
    f'{prefix}_b2': ((heads, d_out), _BIAS_INIT),
  }


def per_head_mlp(x, params, prefix: str, compute):
  """`W2 relu(W1 x + b1) + b2` with one MLP per head.

  Args:
    x: `[..., heads, d_in]`.
    params: dict holding `prefix`_w1 `[heads, d_in, hidden]`, _b1 `[heads,
      hidden]`, _w2 `[heads, hidden, d_out]`, _b2 `[heads, d_out]`.
    prefix: parameter name prefix.
    compute: computation dtype.

  Returns:
    `[..., heads, d_out]` in `compute`. Time O(... heads hidden (d_in + d_out)).
  """
  w1, b1, w2, b2 = (
    jnp.asarray(params[f'{prefix}_{n}']).astype(compute) for n in ('w1', 'b1', 'w2', 'b2')
  )
  hid = jax.nn.relu(jnp.einsum('...hd,hdk->...hk', x.astype(compute), w1) + b1)
  return jnp.einsum('...hk,hko->...ho', hid, w2) + b2


def init_from_specs(specs: ParamSpecs, key, dtype=jnp.float32) -> Dict[str, jnp.ndarray]:
  """Materialise a `param_specs` dict: {name: init(fold_in(key, i), shape, dtype)}.

  Names are visited in sorted order, so the result depends only on `key` and
  the specs. For pure-function callers and tests; Linen wrappers create the
  same arrays with `self.param(name, init, shape, param_dtype)`.
  """
  return {
    name: init(jax.random.fold_in(key, i), shape, dtype)
    for i, (name, (shape, init)) in enumerate(sorted(specs.items()))
  }


def require_params(params, names, who: str):
  """Raise a one-line ValueError naming the `names` missing from `params`."""
  missing = [n for n in names if n not in params]
  if missing:
    raise ValueError(
      f'{who} params lack {", ".join(map(repr, missing))}; got keys {sorted(params)}'
    )

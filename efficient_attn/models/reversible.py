"""Reversible residual layers (Gomez et al. 2017, "The Reversible Residual Network"),
as the Reformer uses them (Kitaev et al. 2020).

The token stream is carried as two halves (x1, x2), both the embeddings at the
start. Block i computes

    y1 = x1 + F_i(x2)          F = dropout(attention(LayerNorm(.)))
    y2 = x2 + G_i(y1)          G = MLP(LayerNorm(.))

and the stack returns (y1 + y2) / 2. Each block's inputs follow from its
outputs (x2 = y2 - G_i(y1), x1 = y1 - F_i(x2)), so the backward pass
(`jax.custom_vjp`) recomputes them block by block from the last outputs
instead of storing them: activation memory is that of one block, whatever the
depth. Dropout and other random draws are keyed per block, so the recomputed
forward draws what the forward drew. The reconstruction costs one extra
forward of every block, and its rounding makes gradients equal to those of
the same stack without the trick to float32 tolerance, not bit for bit.

Tokens `[batch, length, d_model]`; masks as in `efficient_attn.MultiHeadAttention`.
"""

import functools
from typing import Any, Mapping, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from efficient_attn.models import blocks

RNG_STREAMS = ('dropout', 'features')  # the streams attention and dropout draw from


class AttentionBranch(nn.Module):
  """F: LayerNorm -> attention -> dropout."""

  config: blocks.TransformerConfig
  shared_params: Optional[Mapping[str, Any]] = None

  @nn.compact
  def __call__(self, x, mask=None, deterministic: bool = True, segment_ids=None, positions=None):
    c = self.config
    y = nn.LayerNorm(dtype=c.dtype, param_dtype=c.param_dtype)(x)
    y = blocks.attention_layer(c, self.shared_params)(
      y, mask=mask, deterministic=deterministic, segment_ids=segment_ids, positions=positions
    )
    return nn.Dropout(c.dropout_rate)(y, deterministic=deterministic)


class MlpBranch(nn.Module):
  """G: LayerNorm -> MLP (with its dropout)."""

  config: blocks.TransformerConfig

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    c = self.config
    y = nn.LayerNorm(dtype=c.dtype, param_dtype=c.param_dtype)(x)
    return blocks.MlpBlock(c, name='mlp')(y, deterministic=deterministic)


def _branches(config, shared, params, keys, rows, deterministic):
  """Pure F_i(x), G_i(x) of one block from its params and rng keys; `rows` = (mask,
  segment_ids, positions) of the attention."""
  pf, pg = params
  kf, kg = keys
  mask, segment_ids, positions = rows

  def f(pf, shared, x):
    return AttentionBranch(config, shared).apply(
      {'params': pf}, x, mask, deterministic, segment_ids, positions, rngs=kf
    )

  def g(pg, x):
    return MlpBranch(config).apply({'params': pg}, x, deterministic, rngs=kg)

  return f, g


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 6))
def _stack(config, params, shared, x1, x2, aux, deterministic):
  rows, keys = aux
  for p, k in zip(params, keys):
    f, g = _branches(config, shared, p, k, rows, deterministic)
    x1 = x1 + f(p[0], shared, x2)
    x2 = x2 + g(p[1], x1)
  return x1, x2


def _stack_fwd(config, params, shared, x1, x2, aux, deterministic):
  y1, y2 = _stack(config, params, shared, x1, x2, aux, deterministic)
  return (y1, y2), (params, shared, y1, y2, aux)  # no per-block activations kept


def _stack_bwd(config, deterministic, residuals, cotangents):
  params, shared, y1, y2, aux = residuals
  rows, keys = aux
  dy1, dy2 = cotangents
  d_params = []
  d_shared = jax.tree.map(jnp.zeros_like, shared)
  for p, k in reversed(list(zip(params, keys))):
    f, g = _branches(config, shared, p, k, rows, deterministic)
    g_out, g_vjp = jax.vjp(g, p[1], y1)
    x2 = y2 - g_out
    dpg, dg_y1 = g_vjp(dy2)
    dy1 = dy1 + dg_y1
    f_out, f_vjp = jax.vjp(f, p[0], shared, x2)
    x1 = y1 - f_out
    dpf, dsh, df_x2 = f_vjp(dy1)
    dy2 = dy2 + df_x2
    d_shared = jax.tree.map(jnp.add, d_shared, dsh)
    d_params.append((dpf, dpg))
    y1, y2 = x1, x2
  return tuple(reversed(d_params)), d_shared, dy1, dy2, None


_stack.defvjp(_stack_fwd, _stack_bwd)


class ReversibleStack(nn.Module):
  """`config.depth` reversible blocks; x `[batch, length, d_model]` -> same shape.

  Parameters: `block_<i>_attention` (F) and `block_<i>_mlp` (G) per block.
  `shared_params`: attention parameters every block shares (e.g. Linformer's
  layerwise projection), differentiated through the reversible backward.
  """

  config: blocks.TransformerConfig
  shared_params: Optional[Mapping[str, Any]] = None

  @nn.compact
  def __call__(self, x, mask=None, deterministic: bool = True, segment_ids=None, positions=None):
    """x `[batch, length, d_model]`; mask, segment_ids and positions as the `Encoder`'s."""
    c = self.config
    if c.decode:
      raise ValueError(
        'reversible layers are for training the encoder; decoding '
        '(decode=True) needs the ordinary stack (reversible=False)'
      )
    fs = [
      AttentionBranch(c, self.shared_params, name=f'block_{i}_attention') for i in range(c.depth)
    ]
    gs = [MlpBranch(c, name=f'block_{i}_mlp') for i in range(c.depth)]
    keys = self._keys(deterministic)
    if self.is_initializing():  # create the parameters with an ordinary forward
      x1 = x2 = x
      for f, g in zip(fs, gs):
        x1 = x1 + f(x2, mask, deterministic, segment_ids, positions)
        x2 = x2 + g(x1, deterministic)
      return (x1 + x2) / 2
    params = tuple((f.variables['params'], g.variables['params']) for f, g in zip(fs, gs))
    shared = dict(self.shared_params or {})
    rows = (mask, segment_ids, positions)
    y1, y2 = _stack(c, params, shared, x, x, (rows, keys), deterministic)
    return (y1 + y2) / 2

  def _keys(self, deterministic: bool) -> Tuple[Tuple[Mapping[str, Any], ...], ...]:
    """Per block, the rng keys of F and of G (the same in the forward and its recompute)."""
    base = (
      {}
      if deterministic
      else {name: self.make_rng(name) for name in RNG_STREAMS if self.has_rng(name)}
    )
    return tuple(
      tuple(
        {name: jax.random.fold_in(key, 2 * i + j) for name, key in base.items()} for j in range(2)
      )
      for i in range(self.config.depth)
    )

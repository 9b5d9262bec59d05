"""`Mechanism`: a registered mechanism as a Linen module, on projected heads.

It creates the parameters its declaration (`efficient_attn.registry`) asks for and runs
the declared `attend` (or a decoding step) through `efficient_attn.layers.multi_head`;
nothing here names a particular mechanism. `efficient_attn.MultiHeadAttention` holds one
as its 'mechanism' submodule; `mechanism_module` builds one on its own.
"""

import functools
from typing import Any, Mapping, Optional, Union

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.layers import head_shapes
from efficient_attn.layers import multi_head


class _LinenContext(registry.Context):
  """`registry.Context` of a Linen module: rng streams from the module, its path as tag."""

  def __init__(self, module: nn.Module, deterministic: bool, dropout_rng=None):
    super().__init__(
      deterministic=deterministic,
      tag=tuple(module.scope.path) if module.scope is not None else (),
      dropout_rate=module.dropout_rate,
      broadcast_dropout=module.broadcast_dropout,
      max_length=module.max_length,
    )
    self._module = module
    self._dropout_rng = dropout_rng

  def rng(self, name: str):
    if name == 'dropout' and self._dropout_rng is not None:
      return self._dropout_rng
    return self._module.make_rng(name) if self._module.has_rng(name) else None


class Mechanism(nn.Module):
  """Runs a registered mechanism on projected heads and owns the parameters it declares.

  `__call__(q, k, v, mask=None, deterministic=True)` maps q `[batch, q_length,
  heads, head_dim]`, k `[batch, kv_length, heads, head_dim]`, v `[batch,
  kv_length, heads, v_dim]` to `[batch, q_length, heads, v_dim]`; with
  `state=...` it is one recurrent decoding step instead (see `decoding`). A
  mechanism whose gates read the layer input (`reads_input`, e.g. 'gla') takes it
  as `inputs=[batch, q_length, features]` (`MultiHeadAttention` passes its query input).

  Attributes:
    mechanism: a name from `efficient_attn.list_mechanisms()`, or its declaration
      (`registry.declaration`: a model that resolved it passes it down).
    options: the mechanism's options (checked; unknown names are an error).
    causal: query i attends only to keys j <= i.
    max_length: the longest sequence (fixed-length mechanisms need it).
    dtype: computation dtype (None: the inputs'); param_dtype: parameters'.
    dropout_rate, broadcast_dropout: attention-weight dropout (mechanisms
      that form the weights).
    shared_params: parameters shared by every layer of a model (the
      declaration's `shared_params`, created by the model).
    rotary: rotary positions (Su et al. 2021) on q and k, or on the numerator's
      kernel features (the declaration's `rotary` form).
    head_dim: the layer's head_dim (qkv_features / heads) for a mechanism whose
      declared head shapes differ from it (`registry.Mechanism.head_shapes`, e.g.
      Mamba-2's d_state): q and k are then `[..., qk_heads, qk_dim]` and v
      `[..., heads, v_dim]`. None: q's head_dim.
    sequence_axis: split the sequence over this axis of the ambient mesh (context
      parallelism; see `MultiHeadAttention`). None: no split.
  """

  mechanism: Union[str, registry.Mechanism] = 'softmax'
  options: Optional[Mapping[str, Any]] = None
  causal: bool = False
  max_length: Optional[int] = None
  dtype: Any = None
  param_dtype: Any = jnp.float32
  dropout_rate: float = 0.0
  broadcast_dropout: bool = True
  shared_params: Optional[Mapping[str, Any]] = None
  rotary: bool = False
  head_dim: Optional[int] = None
  sequence_axis: Optional[str] = None

  @functools.cached_property
  def _configured(self):
    """(declaration, resolved options): configured once per module construction."""
    return registry.configure(
      self.mechanism,
      self.options,
      causal=self.causal,
      max_length=self.max_length,
      rotary=self.rotary,
    )

  def configured(self, length: Optional[int] = None):
    """(declaration, resolved options), checked against this module's settings (and
    `length`, the keys' length, when given)."""
    decl, options = self._configured
    if length is not None:
      registry.check_length(
        decl, options, length=length, max_length=self.max_length, causal=self.causal
      )
    return decl, options

  @nn.compact
  def __call__(
    self,
    q,
    k,
    v,
    mask=None,
    deterministic: bool = True,
    *,
    state=None,
    position=None,
    dropout_rng=None,
    sow_weights: bool = False,
    force_fp32_for_softmax: bool = False,
    inputs=None,
    segment_ids=None,
    positions=None,
  ):
    """See the class docstring; `position`: a decoding call's positions (rotary);
    sow_weights / force_fp32_for_softmax / inputs / segment_ids / positions: see
    `multi_head.run_mechanism`."""
    decl, options = self.configured(k.shape[1] if state is None else None)
    heads, head_dim = head_shapes.check_inputs(
      decl, q, k, v, mask, stepping=state is not None, options=options, head_dim=self.head_dim
    )  # before shapes are read
    specs = multi_head.declared_params(
      decl,
      options,
      heads=heads,
      head_dim=head_dim,
      max_length=self.max_length,
      causal=self.causal,
      features=None if inputs is None else inputs.shape[-1],
    )
    params = {
      name: self.param(name, init, shape, self.param_dtype) for name, (shape, init) in specs.items()
    }
    params.update(self.shared_params or {})
    return multi_head.run_mechanism(
      decl,
      options,
      params,
      q,
      k,
      v,
      mask=mask,
      causal=self.causal,
      ctx=_LinenContext(self, deterministic, dropout_rng),
      use_rotary=self.rotary,
      dtype=self.dtype,
      state=state,
      position=position,
      sow_weights=sow_weights,
      force_fp32_for_softmax=force_fp32_for_softmax,
      inputs=inputs,
      head_dim=head_dim,
      sequence_axis=self.sequence_axis,
      segment_ids=segment_ids,
      positions=positions,
    )


def mechanism_module(
  mechanism: str,
  *,
  causal: bool = False,
  max_length: Optional[int] = None,
  options: Optional[Mapping[str, Any]] = None,
  **module_kwargs,
) -> Mechanism:
  """The Linen `Mechanism` for `mechanism`, its configuration checked at once.

  Raises ValueError naming the bad value and the valid ones for an unknown
  mechanism or option, an option out of range, a causal request to a
  mechanism without a causal form, or a fixed-length mechanism without
  `max_length`.
  """
  registry.configure(mechanism, options, causal=causal, max_length=max_length)
  return Mechanism(
    mechanism=mechanism,
    causal=causal,
    max_length=max_length,
    options=dict(options or {}),
    **module_kwargs,
  )

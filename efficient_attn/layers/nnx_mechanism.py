"""The NNX modules a layer is built of: `Mechanism` (a registered mechanism on projected
heads, owning the parameters it declares) and `Alignment` (the super projection's W_A).

They run what the Linen modules run (`efficient_attn.layers.multi_head`,
`efficient_attn.layers.projections`), under the same parameter names;
`efficient_attn.layers.nnx.MultiHeadAttention` holds them.
"""

from typing import Any, Mapping, Optional, Sequence, Union

from flax import nnx
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.layers import multi_head
from efficient_attn.layers import projections


class _Context(registry.Context):
  """`registry.Context` of an NNX module: random streams from an `nnx.Rngs` or stream."""

  def __init__(self, mechanism: 'Mechanism', deterministic: bool, rngs):
    super().__init__(
      deterministic=deterministic,
      tag=mechanism.tag,
      dropout_rate=mechanism.dropout_rate,
      broadcast_dropout=mechanism.broadcast_dropout,
      max_length=mechanism.max_length,
    )
    self._stream = rngs

  def rng(self, name: str):
    if self._stream is None:
      return None
    if isinstance(self._stream, nnx.Rngs):
      return self._stream[name]()
    return self._stream()


class Mechanism(nnx.Module):
  """A registered mechanism on projected heads, owning the parameters it declares.

  `__call__(q, k, v, mask=None, deterministic=True, rngs=None)` maps q `[batch,
  q_length, heads, head_dim]`, k `[batch, kv_length, heads, head_dim]`, v
  `[batch, kv_length, heads, v_dim]` to `[batch, q_length, heads, v_dim]`; with
  `state=...` it is one recurrent decoding step. The Linen `Mechanism` with
  the same arguments has the same parameters under the same names. A mechanism
  whose gates read the layer input (`reads_input`) needs `in_features` here and
  the call's `inputs` `[batch, q_length, in_features]`. `sequence_axis` splits the
  sequence over that axis of the ambient mesh (see `efficient_attn.MultiHeadAttention`). One that
  declares other head
  shapes (`registry.Mechanism.head_shapes`) takes q and k `[..., qk_heads, qk_dim]` and
  v `[..., num_heads, v_dim]` for `num_heads` heads of `head_dim`.
  """

  def __init__(
    self,
    mechanism: Union[str, registry.Mechanism] = 'softmax',
    *,
    num_heads: int,
    head_dim: int,
    options: Optional[Mapping[str, Any]] = None,
    causal: bool = False,
    max_length: Optional[int] = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    dropout_rate: float = 0.0,
    broadcast_dropout: bool = True,
    rotary: bool = False,
    shared_params: Optional[Mapping[str, Any]] = None,
    tag: Sequence[str] = ('mechanism',),
    in_features: Optional[int] = None,
    sequence_axis: Optional[str] = None,
    rngs: nnx.Rngs,
  ):
    # Configured once, here; the calls read self.decl and self.resolved.
    self.decl, self.resolved = registry.configure(
      mechanism, options, causal=causal, max_length=max_length, rotary=rotary
    )
    self.name, self.options = self.decl.name, dict(options or {})
    self.causal, self.max_length, self.rotary = causal, max_length, rotary
    self.dtype, self.dropout_rate, self.broadcast_dropout = dtype, dropout_rate, broadcast_dropout
    self.tag, self.head_dim, self.sequence_axis = tuple(tag), head_dim, sequence_axis
    specs = multi_head.declared_params(
      self.decl,
      self.resolved,
      heads=num_heads,
      head_dim=head_dim,
      max_length=max_length,
      causal=causal,
      features=in_features,
    )
    for name, (shape, init) in specs.items():
      setattr(self, name, nnx.Param(init(rngs.params(), shape, param_dtype)))
    self.param_names = tuple(specs)
    self.shared_params = nnx.data(dict(shared_params or {}))

  def params(self):
    """The declared parameters (and shared ones) as arrays, by name."""
    params = {name: getattr(self, name)[...] for name in self.param_names}
    params.update(
      {name: p[...] if isinstance(p, nnx.Variable) else p for name, p in self.shared_params.items()}
    )
    return params

  def __call__(
    self,
    q,
    k,
    v,
    mask=None,
    deterministic: bool = True,
    *,
    rngs=None,
    state=None,
    position=None,
    sow_weights: bool = False,
    force_fp32_for_softmax: bool = False,
    inputs=None,
    segment_ids=None,
    positions=None,
  ):
    if state is None:
      registry.check_length(
        self.decl, self.resolved, length=k.shape[1], max_length=self.max_length, causal=self.causal
      )
    return multi_head.run_mechanism(
      self.decl,
      self.resolved,
      self.params(),
      q,
      k,
      v,
      mask=mask,
      causal=self.causal,
      ctx=_Context(self, deterministic, rngs),
      use_rotary=self.rotary,
      dtype=self.dtype,
      state=state,
      position=position,
      sow_weights=sow_weights,
      force_fp32_for_softmax=force_fp32_for_softmax,
      inputs=inputs,
      head_dim=self.head_dim,
      sequence_axis=self.sequence_axis,
      segment_ids=segment_ids,
      positions=positions,
    )


class Alignment(nnx.Module):
  """Super Attention's W_A `[l, l]` and b_A `[l]` (see `projections.align`)."""

  def __init__(
    self,
    max_length: Optional[int],
    causal: bool = False,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    *,
    rngs: nnx.Rngs,
  ):
    if max_length is None:
      projections.alignment_kernel(None, causal)  # the one error for a missing length
    self.causal, self.dtype = causal, dtype
    self.kernel = nnx.Param(
      projections.identity_init(rngs.params(), (max_length, max_length), param_dtype)
    )
    self.bias = nnx.Param(jnp.zeros((max_length,), param_dtype))

  def __call__(self, v, index=None, count: int = 1):
    return projections.align(
      self.kernel[...],
      self.bias[...],
      v,
      causal=self.causal,
      dtype=self.dtype,
      index=index,
      count=count,
    )

"""Flax NNX modules: the same mechanisms and projections as the Linen layer.

    from flax import nnx
    import efficient_attn.nnx as ean

    layer = ean.MultiHeadAttention(num_heads=4, in_features=64, mechanism='linear',
                                   projection='efficient', rngs=nnx.Rngs(0))
    y = layer(x)                                   # x [..., length, 64]

`MultiHeadAttention` takes the constructor and call arguments of
`flax.nnx.MultiHeadAttention` plus `mechanism`, `projection`, `options`,
`causal`, `max_length` and `rotary`, and builds every mechanism and projection
in the registry from what the mechanism declares (`efficient_attn.registry`):
its parameter shapes become `nnx.Param`s, and the call runs the same
functions as the Linen layer (`efficient_attn.layers.multi_head`), so both give the same
outputs and the same errors. The parameter tree has the Linen layer's names
('query', 'key', 'value', 'alignment', 'mechanism', 'out'): `to_linen_params` and
`load_linen_params` (`efficient_attn.layers.nnx_params`) move weights between the two
APIs. Its parts, `Mechanism` and `Alignment`, are `efficient_attn.layers.nnx_mechanism`.

Decoding follows NNX: `layer.init_cache((batch, max_length, features))`, then
call the layer with one token `[batch, 1, features]` and `decode=True` (or build
it with `decode=True`). Recurrent mechanisms (linear, rfa, performer) keep a
constant-size state (`cached_state`); softmax and local keep keys and values
(`cached_key`, `cached_value`, as flax); `cache_index` is the next position.

Random features: a mechanism's fixed random draw is keyed by `tag`, the layer's
name (the Linen layer uses its module path). The default, ('mechanism',), is the
draw of a top-level Linen layer; give each layer of a model its own tag.
"""

import functools
import math
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from flax import nnx
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.layers import cache as cache_lib
from efficient_attn.layers import checks
from efficient_attn.layers import decoding
from efficient_attn.layers import head_shapes
from efficient_attn.layers import projections
from efficient_attn.layers.nnx_mechanism import Alignment
from efficient_attn.layers.nnx_mechanism import Mechanism

_default_kernel_init = nnx.initializers.lecun_normal()
_default_bias_init = nnx.initializers.zeros_init()


def _first(*values, default=None):
  return next((v for v in values if v is not None), default)


class MultiHeadAttention(nnx.Module):
  """Multi-head attention = projection scheme x mechanism, as an NNX module.

  Arguments as `flax.nnx.MultiHeadAttention` (num_heads, in_features,
  qkv_features, out_features, in_kv_features, dtype, param_dtype,
  broadcast_dropout, dropout_rate, deterministic, precision, kernel_init,
  out_kernel_init, bias_init, out_bias_init, use_bias, decode, rngs, keep_rngs)
  and as `efficient_attn.MultiHeadAttention`: mechanism, projection, options,
  causal, max_length, rotary, shared_params, force_fp32_for_softmax; `tag`
  names the layer's fixed random draw (see the module docstring).
  `normalize_qk` is QK layer norm and `num_kv_heads` grouped-query attention,
  as flax's (see `efficient_attn.MultiHeadAttention` for both, and for
  `force_fp32_for_softmax`, for options that set the head shapes, and for
  `sequence_axis`, context parallelism over an axis of the ambient mesh). The call's
  `sow_weights=True` sows the attention weights as `nnx.Intermediate`
  'attention_weights', as flax does.
  """

  def __init__(
    self,
    num_heads: int,
    in_features: int,
    qkv_features: Optional[int] = None,
    out_features: Optional[int] = None,
    num_kv_heads: Optional[int] = None,
    in_kv_features: Optional[int] = None,
    *,
    mechanism: str = 'softmax',
    projection: str = 'standard',
    options: Optional[Mapping[str, Any]] = None,
    causal: bool = False,
    max_length: Optional[int] = None,
    rotary: bool = False,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    broadcast_dropout: bool = True,
    dropout_rate: float = 0.0,
    deterministic: Optional[bool] = None,
    precision: Any = None,
    kernel_init: Callable[..., Any] = _default_kernel_init,
    out_kernel_init: Optional[Callable[..., Any]] = None,
    bias_init: Callable[..., Any] = _default_bias_init,
    out_bias_init: Optional[Callable[..., Any]] = None,
    use_bias: bool = True,
    decode: Optional[bool] = None,
    normalize_qk: bool = False,
    force_fp32_for_softmax: bool = False,
    shared_params: Optional[Mapping[str, Any]] = None,
    tag: Sequence[str] = ('mechanism',),
    sequence_axis: Optional[str] = None,
    rngs: nnx.Rngs,
    keep_rngs: bool = True,
  ):
    registry.check_projection(projection)
    decl = registry.declaration(mechanism)  # looked up once; `Mechanism` configures it
    self.num_kv_heads = head_shapes.kv_heads(decl, projection, num_heads, num_kv_heads)
    checks.check_weights_args(decl, force_fp32_for_softmax=force_fp32_for_softmax)
    self.force_fp32_for_softmax = force_fp32_for_softmax
    self.num_heads, self.in_features = num_heads, in_features
    self.qkv_features = qkv_features or in_features
    self.out_features = out_features or in_features
    self.in_kv_features = in_kv_features or in_features
    self.head_dim = head_shapes.head_dim(num_heads, self.qkv_features)
    shapes = head_shapes.head_layout(
      decl,
      decl.resolve(options),
      projection=projection,
      heads=num_heads,
      head_dim=self.head_dim,
      kv_heads=self.num_kv_heads,
    )
    self.qk_dim, self.v_dim = shapes.qk_dim, shapes.v_dim
    self.projection, self.causal, self.max_length = projection, causal, max_length
    self.dtype, self.dropout_rate, self.deterministic = dtype, dropout_rate, deterministic
    self.decode, self.rotary = decode, rotary
    checks.check_dropout(decl, dropout_rate)
    self.shared_qk = decl.shared_qk

    linear = functools.partial(
      nnx.LinearGeneral,
      dtype=dtype,
      param_dtype=param_dtype,
      kernel_init=kernel_init,
      bias_init=bias_init,
      use_bias=use_bias,
      precision=precision,
      rngs=rngs,
    )
    for name in projections.dense_names(projection, decl.shared_qk):
      query = name == 'query'
      setattr(
        self, name, linear(in_features if query else self.in_kv_features, shapes.features(name))
      )
    for name in ('query_ln',) + (() if decl.shared_qk else ('key_ln',)):
      setattr(
        self,
        name,
        nnx.LayerNorm(self.qk_dim, use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        if normalize_qk
        else nnx.data(None),
      )
    self.normalize_qk = normalize_qk
    self.alignment = (
      Alignment(max_length, causal, dtype, param_dtype, rngs=rngs)
      if projection == 'super'
      else nnx.data(None)
    )
    self.mechanism = Mechanism(
      decl,
      num_heads=num_heads,
      head_dim=self.head_dim,
      options=options,
      causal=causal,
      max_length=max_length,
      dtype=dtype,
      param_dtype=param_dtype,
      dropout_rate=dropout_rate,
      broadcast_dropout=broadcast_dropout,
      rotary=rotary,
      shared_params=shared_params,
      tag=tag,
      in_features=in_features,
      sequence_axis=sequence_axis,
      rngs=rngs,
    )
    self.out = nnx.LinearGeneral(
      in_features=(num_heads, self.v_dim),
      out_features=self.out_features,
      axis=(-2, -1),
      kernel_init=out_kernel_init or kernel_init,
      bias_init=out_bias_init or bias_init,
      use_bias=use_bias,
      dtype=dtype,
      param_dtype=param_dtype,
      precision=precision,
      rngs=rngs,
    )
    # Kept as flax keeps it: the dropout stream (a mechanism's redraws read it too).
    needs_rng = dropout_rate > 0 or bool(self.mechanism.resolved.get('redraw'))
    self.rngs = rngs.dropout.fork() if keep_rngs and needs_rng else nnx.data(None)
    for name in cache_lib.CACHE_NAMES:
      setattr(self, name, nnx.data(None))

  def _form(self, inputs=None) -> decoding.DecodeForm:
    mech = self.mechanism
    return decoding.decode_form(
      mech.decl,
      mech.resolved,
      lambda state, q, k, v, tokens: mech(
        q,
        k,
        v,
        state=state,
        position=tokens.positions,
        inputs=inputs,
        segment_ids=tokens.segment_ids,
      ),
    )

  def init_cache(self, input_shape: Tuple[int, ...], dtype: Any = jnp.float32):
    """An empty decoding cache for inputs `[..., max_length, features]` (any leading
    batch axes; the cache keeps them flattened into one)."""
    if len(input_shape) < 2:
      raise ValueError(
        f'init_cache takes the input shape [..., max_length, features], got {tuple(input_shape)}'
      )
    batch = math.prod(input_shape[:-2])
    mech = self.mechanism
    heads = head_shapes.state_heads(mech.decl, mech.resolved, self.num_heads, self.num_kv_heads)
    cache = cache_lib.init_cache(
      self._form(),
      batch=batch,
      length=input_shape[-2],
      heads=heads,
      head_dim=self.qk_dim,
      v_dim=self.v_dim,
      dtype=dtype,
      super_values=self.projection == 'super',
    )
    for name in cache_lib.CACHE_NAMES:
      setattr(self, name, nnx.Cache(cache[name]) if name in cache else nnx.data(None))  # type: ignore[arg-type]

  def _cache(self):
    return {
      name: getattr(self, name).get_value()
      for name in cache_lib.CACHE_NAMES
      if getattr(self, name) is not None
    }

  def _projections(self):
    return lambda name: getattr(self, name)

  def __call__(
    self,
    inputs_q,
    inputs_k=None,
    inputs_v=None,
    *,
    mask=None,
    deterministic: Optional[bool] = None,
    rngs=None,
    sow_weights: bool = False,
    decode: Optional[bool] = None,
    segment_ids=None,
    positions=None,
  ):
    """As `flax.nnx.MultiHeadAttention`'s call; `segment_ids` and `positions` `[...,
    length]` (packed rows, rotary positions) as `efficient_attn.MultiHeadAttention`'s.
    With `decode`, a call of n tokens runs from the cache and advances it (n = 1: a
    step; n > 1: a prefill, one parallel pass)."""
    inputs_q, inputs_k, inputs_v = checks.resolve_inputs(inputs_q, inputs_k, inputs_v)
    if inputs_q.shape[-1] != self.in_features:
      raise ValueError(
        f'inputs have {inputs_q.shape[-1]} features, but the layer was '
        f'built for in_features={self.in_features}'
      )
    if self.dropout_rate > 0.0:
      deterministic = _first(deterministic, self.deterministic)
      if deterministic is None:
        raise ValueError(
          'dropout_rate > 0 needs deterministic, as a call or a constructor argument'
        )
    else:
      deterministic = True
    rngs = _first(rngs, self.rngs)
    decode = bool(_first(decode, self.decode, default=False))
    batch_shape = inputs_q.shape[:-2]
    return checks.with_one_batch_axis(
      lambda q, k, v, m, ids, pos: self._attend(
        q, k, v, m, deterministic, rngs, decode, sow_weights, batch_shape, ids, pos
      ),
      inputs_q,
      inputs_k,
      inputs_v,
      mask,
      segment_ids,
      positions,
      names=('segment_ids', 'positions'),
    )

  def _attend(
    self,
    inputs_q,
    inputs_k,
    inputs_v,
    mask,
    deterministic,
    rngs,
    decode,
    sow_weights,
    batch_shape,
    segment_ids,
    positions,
  ):
    segment_ids, positions = checks.check_packed(
      self.mechanism.decl,
      segment_ids,
      positions,
      mask=mask,
      inputs_q=inputs_q,
      inputs_k=inputs_k,
      inputs_v=inputs_v,
      projection=self.projection,
    )
    if decode:
      checks.check_decode(
        mask, inputs_q, inputs_k, inputs_v, stepping=True, sow_weights=sow_weights
      )
      if self.cache_index is None:
        raise ValueError(
          'decode=True: the decoding cache is not initialised; call '
          'init_cache((batch, max_length, features)) first'
        )
    align = self.alignment if self.projection == 'super' else None
    q, k, v = projections.project_qkv(
      self.projection,
      inputs_q,
      inputs_k,
      inputs_v,
      num_heads=self.num_heads,
      dense=self._projections(),
      align=None if decode else align,
      dtype=self.dtype,
      shared_qk=self.shared_qk,
      normalize=self._projections() if self.normalize_qk else None,
      mask=mask,
      qkv_features=self.num_heads * self.head_dim,
    )
    if decode:
      cache, x = cache_lib.decode(
        self._form(inputs_q),
        self._cache(),
        q,
        k,
        v,
        align_at=align,
        rotate_scores=self.rotary and self.mechanism.decl.rotary == 'scores',
        segment_ids=segment_ids,
        positions=positions,
      )
      for name, value in cache.items():
        getattr(self, name).set_value(value)
    else:
      x = self.mechanism(
        q,
        k,
        v,
        mask=mask,
        deterministic=deterministic,
        rngs=rngs,
        sow_weights=sow_weights,
        force_fp32_for_softmax=self.force_fp32_for_softmax,
        inputs=inputs_q,
        segment_ids=segment_ids,
        positions=positions,
      )
      if sow_weights:
        x, weights = x
        self.sow(
          nnx.Intermediate, 'attention_weights', weights.reshape(batch_shape + weights.shape[1:])
        )
    return self.out(x)

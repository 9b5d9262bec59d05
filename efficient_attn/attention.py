"""`MultiHeadAttention`: a projection scheme combined with an attention mechanism.

A drop-in replacement for `flax.linen.MultiHeadDotProductAttention`:

    attn = efficient_attn.MultiHeadAttention(
        num_heads=8, mechanism='nystrom', projection='efficient',
        options={'num_landmarks': 32})
    y = attn(x, mask=mask, deterministic=True)     # x [batch, length, features]

Autoregressive decoding (flax lm1b/wmt convention): build the layer with
`causal=True, decode=True`, `init` it with a full-length input to create the
'cache' collection, then `apply(..., x_t, mutable=['cache'])` one token
`[batch, 1, features]` at a time (see `efficient_attn.decoding`).
"""
import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from efficient_attn import decoding
from efficient_attn import projections
from efficient_attn import registry


def mechanism_module(mechanism: str, *, causal: bool = False,
                     max_length: Optional[int] = None,
                     options: Optional[Mapping[str, Any]] = None,
                     **module_kwargs) -> nn.Module:
  """Build the registered Linen module for `mechanism`, checking the config.

  Raises ValueError naming the bad value and the valid ones for an unknown
  mechanism, an unknown option, a causal request to a mechanism without a causal
  form, or a fixed-length mechanism without `max_length`.
  """
  name = mechanism
  spec = registry.get_mechanism(name)
  if causal and not spec.supports_causal:
    causal_ok = [n for n, s in registry.MECHANISMS.items() if s.supports_causal]
    raise ValueError(
        f'mechanism {name!r} has no causal form (it mixes information along the '
        f'sequence before scoring, which would let a token see the future); '
        f'mechanisms with a causal form: {", ".join(causal_ok)}')
  if spec.fixed_length and max_length is None:
    raise ValueError(f'mechanism {name!r} has length-shaped parameters and needs '
                     f'max_length (the longest sequence it will see)')
  cls = spec.module
  options = dict(options or {})
  fields = {f.name for f in dataclasses.fields(cls)} - {'parent', 'name'}
  reserved = {'causal', 'max_length', 'dtype', 'param_dtype'}
  bad = sorted(set(options) - (fields - reserved))
  if bad:
    raise ValueError(f'unknown option(s) {bad} for mechanism {name!r}; valid options: '
                     f'{", ".join(sorted(fields - reserved)) or "(none)"}')
  return cls(causal=causal, max_length=max_length, **options, **module_kwargs)


class MultiHeadAttention(nn.Module):
  """Multi-head attention = projection scheme x mechanism.

  Call signature matches `nn.MultiHeadDotProductAttention`: inputs
  `[batch, length, features]`, an optional flax-style bool mask
  `[batch, heads, q_length, kv_length]` (True = attend), `deterministic`.
  Mechanisms that never form the full attention matrix honour only the
  key-padding part of the mask; ask for causality with `causal=True`.

  Attributes:
    num_heads: number of heads h; must divide qkv_features.
    mechanism: a name from `efficient_attn.list_mechanisms()`.
    projection: 'standard', 'optimised', 'efficient' or 'super'.
    options: mechanism options, e.g. {'num_landmarks': 32} (see each mechanism
      module's fields); unknown keys are an error.
    causal: autoregressive masking (mechanisms and the super kernel).
    max_length: context length for 'super' and fixed-length mechanisms.
    dtype, param_dtype: computation and parameter dtypes.
    qkv_features, out_features: widths (default: the input width).
    dropout_rate, broadcast_dropout: attention-weight dropout (softmax only).
    deterministic: default for the call argument.
    kernel_init, bias_init, use_bias: for the Dense projections.
    decode: one token per call, state in the 'cache' collection (needs causal).
      The cache is created, with room for as many tokens as the input has, by
      the first call that finds none (`init` with a full-length dummy input,
      or `apply(..., mutable=['cache'])` with trained params); that call runs
      the ordinary parallel forward. Later calls take `[batch, 1, features]`.
      Cache: 'index' (next position), 'state' (the mechanism's
      `decoding.DecodeForm` state) and, for 'super', 'values' (the raw values
      that the lower-triangular W_A mixes).
  """
  num_heads: int
  mechanism: str = 'softmax'
  projection: str = 'standard'
  options: Optional[Mapping[str, Any]] = None
  causal: bool = False
  max_length: Optional[int] = None
  dtype: Any = None
  param_dtype: Any = jnp.float32
  qkv_features: Optional[int] = None
  out_features: Optional[int] = None
  dropout_rate: float = 0.0
  broadcast_dropout: bool = True
  deterministic: Optional[bool] = None
  kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
  bias_init: Callable[..., Any] = nn.initializers.zeros_init()
  use_bias: bool = True
  decode: bool = False

  @nn.compact
  def __call__(self, inputs_q, inputs_k=None, inputs_v=None, *, inputs_kv=None,
               mask=None, deterministic: Optional[bool] = None):
    if inputs_kv is not None:
      inputs_k = inputs_v = inputs_kv
    if inputs_k is None:
      inputs_k = inputs_q
    if inputs_v is None:
      inputs_v = inputs_k
    features = self.out_features or inputs_q.shape[-1]
    qkv_features = self.qkv_features or inputs_q.shape[-1]
    if qkv_features % self.num_heads:
      raise ValueError(f'num_heads={self.num_heads} must divide the attention width '
                       f'{qkv_features} (qkv_features / d_model)')
    head_dim = qkv_features // self.num_heads
    if self.dropout_rate > 0.0:  # as flax: only dropout needs to know
      deterministic = nn.merge_param('deterministic', self.deterministic, deterministic)
    elif deterministic is None:
      deterministic = True if self.deterministic is None else self.deterministic

    stepping = self.decode and self.has_variable('cache', 'index')
    if self.decode:
      self._check_decode(inputs_q, inputs_k, inputs_v, mask, stepping)

    dense = functools.partial(
        nn.DenseGeneral, features=(self.num_heads, head_dim), axis=-1,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype)
    q, k, v = projections.project_qkv(
        self.projection, inputs_q, inputs_k, inputs_v, num_heads=self.num_heads,
        dense=lambda name: dense(name=name), causal=self.causal,
        max_length=self.max_length, dtype=self.dtype, param_dtype=self.param_dtype,
        align=not stepping)
    # Captured with `apply(..., mutable=['intermediates'])` by the analysis tools.
    self.sow('intermediates', 'qkv', (q, k, v))

    extra = {}
    if self.dropout_rate > 0.0:
      with_weights = [n for n, s in registry.MECHANISMS.items()
                      if 'dropout_rate' in {f.name for f in dataclasses.fields(s.module)}]
      if self.mechanism not in with_weights:
        raise ValueError(
            f'dropout_rate={self.dropout_rate}: attention-weight dropout needs a mechanism '
            f'that forms attention weights ({", ".join(with_weights)}), not '
            f'{self.mechanism!r}; set the attention dropout rate to 0')
      extra = dict(dropout_rate=self.dropout_rate, broadcast_dropout=self.broadcast_dropout)
    options = dict(self.options or {}, **extra)
    mech = mechanism_module(self.mechanism, causal=self.causal,
                            max_length=self.max_length, options=options,
                            dtype=self.dtype, param_dtype=self.param_dtype,
                            name='mechanism')
    if self.decode:
      x = self._decode(mech, q, k, v, mask, deterministic, inputs_q.shape[1], stepping)
    else:
      x = mech(q, k, v, mask=mask, deterministic=deterministic)
    return nn.DenseGeneral(
        features=features, axis=(-2, -1), kernel_init=self.kernel_init,
        bias_init=self.bias_init, use_bias=self.use_bias, dtype=self.dtype,
        param_dtype=self.param_dtype, name='out')(x)


  def _check_decode(self, inputs_q, inputs_k, inputs_v, mask, stepping):
    if not self.causal:
      raise ValueError('decode=True needs causal=True (a token generated one at a time '
                       'can only attend to the past)')
    if mask is not None:
      raise ValueError('decode=True takes no mask (causality comes from the cache)')
    if not (inputs_q is inputs_k is inputs_v):
      raise ValueError('decode=True supports self-attention only')
    if stepping and inputs_q.shape[1] != 1:
      raise ValueError(f'a decoding step takes one token [batch, 1, features], got '
                       f'shape {inputs_q.shape} (the cache already exists)')

  def _decode(self, mech, q, k, v, mask, deterministic, length, stepping):
    """The one place for cache logic: create it, or advance it by one token."""
    form = decoding.decode_form(self.mechanism, mech)
    b, _, h, dk = q.shape
    index = self.variable('cache', 'index', lambda: jnp.zeros((), jnp.int32))
    state = self.variable('cache', 'state', form.init, b, length, h, dk, v.shape[-1],
                          q.dtype)
    if self.projection == 'super':
      values = self.variable('cache', 'values', jnp.zeros, (b, length) + v.shape[2:],
                             v.dtype)
    if not stepping:  # cache just created: the ordinary parallel forward
      return mech(q, k, v, mask=mask, deterministic=deterministic)
    i = index.value
    if self.projection == 'super':
      values.value = lax.dynamic_update_slice_in_dim(values.value, v, i, axis=1)
      v = projections.alignment_kernel(self.max_length, self.causal, self.dtype,
                                       self.param_dtype)(values.value, index=i)
    state.value, x = form.step(state.value, q, k, v, i)
    index.value = i + 1
    return x


def make_attention_fn(mechanism: str = 'softmax', **options) -> Callable[..., Any]:
  """A parameter-free mechanism as an `attention_fn` for `nn.MultiHeadDotProductAttention`.

      layer = nn.MultiHeadDotProductAttention(
          num_heads=4, attention_fn=efficient_attn.make_attention_fn('linear'))

  The returned function takes query/key/value `[batch, length, heads, head_dim]`
  and flax's mask; options are passed to the mechanism's pure function.
  """
  spec = registry.get_mechanism(mechanism)
  if not spec.parameter_free:
    free = [n for n, s in registry.MECHANISMS.items() if s.parameter_free]
    raise ValueError(f'mechanism {mechanism!r} has parameters or random features and '
                     f'cannot be an attention_fn; use efficient_attn.MultiHeadAttention, '
                     f'or one of: {", ".join(free)}')
  fn = spec.fn

  def attention_fn(query, key, value, bias=None, mask=None, dtype=None, **unused):
    if bias is not None:
      raise ValueError(f'attention bias is not supported by mechanism {mechanism!r}')
    if dtype is not None:
      query, key, value = (x.astype(dtype) for x in (query, key, value))
    return fn(query, key, value, mask=mask, **options)

  return attention_fn

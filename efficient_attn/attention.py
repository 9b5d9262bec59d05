"""`MultiHeadAttention`: a projection scheme combined with an attention mechanism.

A drop-in replacement for `flax.linen.MultiHeadDotProductAttention`:

    attn = efficient_attn.MultiHeadAttention(
        num_heads=8, mechanism='nystrom', projection='efficient',
        options={'num_landmarks': 32})
    y = attn(x, mask=mask, deterministic=True)     # x [..., length, features]

Autoregressive decoding (flax lm1b/wmt convention): build the layer with
`causal=True, decode=True`, `init` it with a full-length input to create the
'cache' collection, then `apply(..., x_t, mutable=['cache'])` one token
`[batch, 1, features]` at a time (see `efficient_attn.decoding`).

The mechanism itself runs in `Mechanism`, a Linen module that creates the
parameters its declaration (`efficient_attn.registry`) asks for and calls the
declared `attend`; nothing here names a particular mechanism.
"""
import functools
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from efficient_attn import checks
from efficient_attn import decoding
from efficient_attn import masking
from efficient_attn import projections
from efficient_attn import registry
from efficient_attn import rotary


class _LinenContext(registry.Context):
  """`registry.Context` of a Linen module: rng streams from the module, its path as tag."""

  def __init__(self, module: nn.Module, deterministic: bool):
    super().__init__(deterministic=deterministic, tag=tuple(module.scope.path),
                     dropout_rate=module.dropout_rate,
                     broadcast_dropout=module.broadcast_dropout, max_length=module.max_length)
    self._module = module

  def rng(self, name: str):
    return self._module.make_rng(name) if self._module.has_rng(name) else None


def check_mask(decl: registry.Mechanism, mask, q_length: int) -> None:
  """Refuses a mask a key-padding-only mechanism cannot honour (e.g. a causal mask).

  A 4-D mask `[b, h, q, k]` is key padding when it is the outer product of a
  query and a key validity (`make_attention_mask(q_valid, k_valid)`), the same
  for every head. Concrete masks are checked at once, traced ones when they run.
  """
  if decl.masks != 'key_padding' or mask is None or jnp.ndim(mask) != 4 or (
      mask.shape[2] == 1 or q_length == 1):
    return
  mask = jnp.asarray(mask, bool)
  keys = jnp.any(mask, axis=(1, 2), keepdims=True)
  queries = jnp.any(mask, axis=(1, 3), keepdims=True)
  ok = jnp.all(mask == (keys & queries))
  checks.runtime_check(
      ok, f'mechanism {decl.name!r} honours only key-padding masks, and this '
      f'[batch, heads, q_length, kv_length] mask is not one (is it a causal mask from '
      f'nn.make_causal_mask?): ask for causality with causal=True, and pass padding as '
      f'a [batch, kv_length] mask or make_attention_mask(valid, valid)')


class Mechanism(nn.Module):
  """Runs a registered mechanism on projected heads and owns the parameters it declares.

  `__call__(q, k, v, mask=None, deterministic=True)` maps q `[batch, q_length,
  heads, head_dim]`, k `[batch, kv_length, heads, head_dim]`, v `[batch,
  kv_length, heads, v_dim]` to `[batch, q_length, heads, v_dim]`; with
  `state=...` it is one recurrent decoding step instead (see `decoding`).

  Attributes:
    mechanism: a name from `efficient_attn.list_mechanisms()`.
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
  """
  mechanism: str = 'softmax'
  options: Optional[Mapping[str, Any]] = None
  causal: bool = False
  max_length: Optional[int] = None
  dtype: Any = None
  param_dtype: Any = jnp.float32
  dropout_rate: float = 0.0
  broadcast_dropout: bool = True
  shared_params: Optional[Mapping[str, Any]] = None
  rotary: bool = False

  def configured(self, length: Optional[int] = None):
    """(declaration, resolved options), checked against this module's settings."""
    return registry.configure(self.mechanism, self.options, causal=self.causal,
                              max_length=self.max_length, length=length, rotary=self.rotary)

  @nn.compact
  def __call__(self, q, k, v, mask=None, deterministic: bool = True, *, state=None,
               position=None):
    """See the class docstring; `position`: a decoding step's position (rotary)."""
    decl, o = self.configured(k.shape[1] if state is None else None)
    masking.check_inputs(q, k, v, mask, name=f'mechanism {self.mechanism!r}',
                         same_length=decl.self_attention_only and state is None)
    heads, head_dim = q.shape[2], q.shape[3]
    specs = decl.params(o, heads=heads, head_dim=head_dim, max_length=self.max_length,
                        causal=self.causal)
    params = {name: self.param(name, init, shape, self.param_dtype)
              for name, (shape, init) in specs.items()}
    params.update(self.shared_params or {})
    ctx = _LinenContext(self, deterministic)
    dtype = self.dtype or q.dtype
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    if self.rotary:
      positions = (rotary.positions_of(q.shape[1], k.shape[1]) if state is None
                   else rotary.at(position))
      if decl.rotary == 'scores':
        q, k = rotary.rotate(q, positions[0]), rotary.rotate(k, positions[1])
      else:
        ctx.positions, ctx.position = positions, position
    if state is not None:
      return decl.step(o, params, state, q, k, v, ctx=ctx)
    check_mask(decl, mask, q.shape[1])
    return decl.attend(o, params, q, k, v, mask=mask, causal=self.causal, ctx=ctx)


def mechanism_module(mechanism: str, *, causal: bool = False,
                     max_length: Optional[int] = None,
                     options: Optional[Mapping[str, Any]] = None,
                     **module_kwargs) -> Mechanism:
  """The Linen `Mechanism` for `mechanism`, its configuration checked at once.

  Raises ValueError naming the bad value and the valid ones for an unknown
  mechanism or option, an option out of range, a causal request to a
  mechanism without a causal form, or a fixed-length mechanism without
  `max_length`.
  """
  registry.configure(mechanism, options, causal=causal, max_length=max_length)
  return Mechanism(mechanism=mechanism, causal=causal, max_length=max_length,
                   options=dict(options or {}), **module_kwargs)


class MultiHeadAttention(nn.Module):
  """Multi-head attention = projection scheme x mechanism.

  Call signature matches `nn.MultiHeadDotProductAttention`: inputs
  `[..., length, features]` (leading axes are batch axes), an optional
  flax-style bool mask `[..., heads, q_length, kv_length]` or a key padding
  mask `[..., kv_length]` (True = attend), `deterministic`. Mechanisms that
  never form the attention matrix honour only key padding and refuse other
  masks; ask for causality with `causal=True`.

  Attributes:
    num_heads: number of heads h; must divide qkv_features.
    mechanism: a name from `efficient_attn.list_mechanisms()`.
    projection: 'standard', 'optimised', 'efficient' or 'super'.
    options: mechanism options, e.g. {'num_landmarks': 32}
      (`efficient_attn.get_mechanism(name).options` lists them); unknown keys
      and out-of-range values are errors.
    causal: autoregressive masking (mechanisms and the super kernel).
    max_length: context length for 'super' and fixed-length mechanisms.
    dtype, param_dtype: computation and parameter dtypes.
    qkv_features, out_features: widths (default: the input width).
    dropout_rate, broadcast_dropout: attention-weight dropout (mechanisms that
      form the weights).
    deterministic: default for the call argument.
    kernel_init, bias_init, use_bias: for the Dense projections.
    shared_params: parameters shared by every layer of a model (e.g. Linformer's
      layerwise E = F), as the mechanism's `shared_params` declares.
    decode: one token per call, state in the 'cache' collection (needs causal).
    rotary: rotary position embeddings (RoPE, Su et al. 2021) on the projected
      queries and keys, or, for kernel mechanisms, RoFormer's linear form
      (rotated features in the numerator only); positions come from the token
      index, in decoding from the cache index. Mechanisms without q . k scores
      (synthesizer, fnet) refuse it.
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
  shared_params: Optional[Mapping[str, Any]] = None
  decode: bool = False
  rotary: bool = False

  @nn.compact
  def __call__(self, inputs_q, inputs_k=None, inputs_v=None, *, inputs_kv=None,
               mask=None, deterministic: Optional[bool] = None):
    if inputs_kv is not None:
      inputs_k = inputs_v = inputs_kv
    if inputs_k is None:
      inputs_k = inputs_q
    if inputs_v is None:
      inputs_v = inputs_k
    batch_shape = inputs_q.shape[:-2]
    if inputs_q.ndim < 2:
      raise ValueError(f'inputs must be [..., length, features], got shape '
                       f'{inputs_q.shape}')
    if len(batch_shape) != 1:  # flax: every axis before [length, features] is a batch axis
      return self._flat_batch(inputs_q, inputs_k, inputs_v, mask, deterministic)
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
    decl = registry.get_mechanism(self.mechanism)
    if self.dropout_rate > 0.0 and not decl.forms_weights:
      with_weights = registry.names_where(lambda m: m.forms_weights)
      raise ValueError(
          f'dropout_rate={self.dropout_rate}: attention-weight dropout needs a mechanism '
          f'that forms attention weights ({", ".join(with_weights)}), not '
          f'{self.mechanism!r}; set the attention dropout rate to 0')

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
        align=not stepping, shared_qk=decl.shared_qk)
    # Captured with `apply(..., mutable=['intermediates'])` by the analysis tools.
    self.sow('intermediates', 'qkv', (q, k, v))

    mech = Mechanism(mechanism=self.mechanism, options=dict(self.options or {}),
                     causal=self.causal, max_length=self.max_length, dtype=self.dtype,
                     param_dtype=self.param_dtype, dropout_rate=self.dropout_rate,
                     broadcast_dropout=self.broadcast_dropout,
                     shared_params=self.shared_params, rotary=self.rotary, name='mechanism')
    if self.decode:
      x = self._decode(mech, q, k, v, mask, deterministic, inputs_q.shape[1], stepping)
    else:
      x = mech(q, k, v, mask=mask, deterministic=deterministic)
    return nn.DenseGeneral(
        features=features, axis=(-2, -1), kernel_init=self.kernel_init,
        bias_init=self.bias_init, use_bias=self.use_bias, dtype=self.dtype,
        param_dtype=self.param_dtype, name='out')(x)

  def _flat_batch(self, inputs_q, inputs_k, inputs_v, mask, deterministic):
    """Inputs with 0 or several batch axes: flattened to one, and the output restored."""
    if self.decode:
      raise ValueError(f'decode=True takes inputs [batch, length, features], got shape '
                       f'{inputs_q.shape}')
    batch_shape = inputs_q.shape[:-2]
    flat = lambda x: x.reshape((-1,) + x.shape[-2:])
    if mask is not None:
      mask = jnp.asarray(mask)
      if mask.ndim == len(batch_shape) + 3:  # [..., heads, q, k]
        mask = jnp.broadcast_to(mask, batch_shape + mask.shape[-3:])
        mask = mask.reshape((-1,) + mask.shape[-3:])
      elif mask.ndim == len(batch_shape) + 1:  # [..., k] key padding
        mask = jnp.broadcast_to(mask, batch_shape + mask.shape[-1:]).reshape(
            (-1, mask.shape[-1]))
      else:
        raise ValueError(f'mask of shape {mask.shape} does not fit inputs of shape '
                         f'{inputs_q.shape}; valid: [..., heads, q_length, kv_length] or '
                         f'[..., kv_length] with the inputs\' batch axes {batch_shape}')
    out = self.__call__(flat(inputs_q), flat(inputs_k), flat(inputs_v), mask=mask,
                        deterministic=deterministic)
    return out.reshape(batch_shape + out.shape[-2:])

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
    decl, o = mech.configured()
    form = decoding.decode_form(
        decl, o, lambda state, q_t, k_t, v_t, i: mech(q_t, k_t, v_t, deterministic=True,
                                                      state=state, position=i))
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
      checks.runtime_check(i < values.value.shape[1], 'decoding step at position {} is past '
                           'the super projection\'s context of {} tokens', i,
                           values.value.shape[1])
      values.value = lax.dynamic_update_slice_in_dim(values.value, v, i, axis=1)
      v = projections.alignment_kernel(self.max_length, self.causal, self.dtype,
                                       self.param_dtype)(values.value, index=i)
    if self.rotary and decl.rotary == 'scores':  # cached keys are stored rotated
      q, k = rotary.rotate(q, i), rotary.rotate(k, i)
    state.value, x = form.step(state.value, q, k, v, i)
    index.value = i + 1
    return x


def make_attention_fn(mechanism: str = 'softmax', **options) -> Callable[..., Any]:
  """A parameter-free mechanism as an `attention_fn` for `nn.MultiHeadDotProductAttention`.

      layer = nn.MultiHeadDotProductAttention(
          num_heads=4, attention_fn=efficient_attn.make_attention_fn('linear'))

  The returned function takes query/key/value `[batch, length, heads, head_dim]`
  and flax's mask; options are the mechanism's (checked here).
  """
  decl, o = registry.configure(mechanism, options)
  if not decl.parameter_free:
    free = registry.names_where(lambda m: m.parameter_free)
    raise ValueError(f'mechanism {mechanism!r} has parameters or random features and '
                     f'cannot be an attention_fn; use efficient_attn.MultiHeadAttention, '
                     f'or one of: {", ".join(free)}')

  def attention_fn(query, key, value, bias=None, mask=None, dtype=None, **unused):
    if bias is not None:
      raise ValueError(f'attention bias is not supported by mechanism {mechanism!r}')
    if dtype is not None:
      query, key, value = (x.astype(dtype) for x in (query, key, value))
    masking.check_inputs(query, key, value, mask, name=f'mechanism {mechanism!r}')
    check_mask(decl, mask, query.shape[1])
    return decl.attend(o, {}, query, key, value, mask=mask, causal=False,
                       ctx=registry.Context())

  return attention_fn


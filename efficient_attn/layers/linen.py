"""`MultiHeadAttention`: a projection scheme combined with an attention mechanism.

A drop-in replacement for `flax.linen.MultiHeadDotProductAttention`:

    attn = efficient_attn.MultiHeadAttention(
        num_heads=8, mechanism='nystrom', projection='efficient',
        options={'num_landmarks': 32})
    y = attn(x, mask=mask, deterministic=True)     # x [..., length, features]

Autoregressive decoding (flax lm1b/wmt convention): build the layer with
`decode=True` (and `causal=True` for a model trained causally), `init` it with
a full-length input to create the 'cache' collection, then `apply(..., x_t,
mutable=['cache'])` one token `[batch, 1, features]` at a time (see
`efficient_attn.layers.decoding`).

The mechanism itself runs in `efficient_attn.layers.linen_mechanism.Mechanism`, a Linen
module that creates the parameters its declaration (`efficient_attn.registry`) asks for
and calls the declared `attend`; nothing here names a particular mechanism.
"""

from typing import Any, Callable, Mapping, Optional, Union

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.layers import cache as cache_lib
from efficient_attn.layers import checks
from efficient_attn.layers import decoding
from efficient_attn.layers import head_shapes
from efficient_attn.layers import projections
from efficient_attn.layers.linen_mechanism import Mechanism


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
    mechanism: a name from `efficient_attn.list_mechanisms()` (or its declaration,
      `registry.declaration`, as the models pass it).
    projection: 'standard', 'optimised', 'efficient' or 'super'.
    options: mechanism options, e.g. {'num_landmarks': 32}
      (`efficient_attn.get_mechanism(name).options` lists them); unknown keys
      and out-of-range values are errors. Some set the mechanism's head shapes
      (`registry.Mechanism.head_shapes`, e.g. Mamba-2's ngroups and d_state,
      RetNet's value_factor): the projections, the output projection and the
      cache follow them, and a scheme that cannot build them is refused
      (`head_shapes.head_layout`).
    causal: autoregressive masking (mechanisms and the super kernel).
    max_length: context length for 'super' and fixed-length mechanisms.
    dtype, param_dtype: computation and parameter dtypes.
    qkv_features, out_features: widths (default: the input width).
    dropout_rate, broadcast_dropout: attention-weight dropout (mechanisms that
      form the weights).
    num_kv_heads: grouped-query attention (Ainslie et al. 2023): keys and values
      get this many heads (a divisor of num_heads; 'standard' projection), so
      their projections and the decoding cache shrink by num_heads / num_kv_heads.
      None: num_heads.
    force_fp32_for_softmax: as flax: the attention weights stay float32 when
      they multiply the values and when sown, whatever `dtype` (scores and
      softmax are float32 in every mechanism regardless). Mechanisms that never
      form the weights refuse it.
    deterministic: default for the call argument.
    kernel_init, bias_init, use_bias, precision: for the Dense projections;
      out_kernel_init, out_bias_init: the output projection's (default: the same).
    normalize_qk: QK layer norm (Dehghani et al. 2023), as flax: a LayerNorm
      without bias on each head's queries ('query_ln') and keys ('key_ln').
    shared_params: parameters shared by every layer of a model (e.g. Linformer's
      layerwise E = F), as the mechanism's `shared_params` declares.
    decode: one token per call, state in the 'cache' collection. A step attends
      to the cached tokens up to its own position (flax's rule), so decoding is
      causal even if the layer is not; train with causal=True to decode what you
      trained.
    rotary: rotary position embeddings (RoPE, Su et al. 2021) on the projected
      queries and keys, or, for kernel mechanisms, RoFormer's linear form
      (rotated features in the numerator only); positions come from the token
      index, in decoding from the cache index. Mechanisms without q . k scores
      (synthesizer, fnet) refuse it.
      The cache is created, with room for as many tokens as the input has (a
      sliding window's ring buffer: min(that, window) slots, no limit), by
      the first call that finds none (`init` with a full-length dummy input,
      or `apply(..., mutable=['cache'])` with trained params); that call runs
      the ordinary parallel forward. Later calls take `[batch, 1, features]`.
      Cache (`efficient_attn.layers.cache.init_cache`): 'cache_index' (next position); 'cached_key'
      and 'cached_value' (as flax) or 'cached_state' (recurrent mechanisms);
      for 'super', 'cached_raw_values' (the raw values W_A mixes).
    sequence_axis: context parallelism: the name of an axis of the ambient mesh
      (`with jax.set_mesh(mesh):`, read when the layer is called) to split the
      sequence over; the mechanism runs on one block of length / devices tokens per
      device (`efficient_attn.layers.parallel`), the batch split over the mesh's other axes.
      Mechanisms with a `sequence_parallel` form only; key padding only; no sown
      weights or attention dropout in training; a decoding step is not split. None
      (default): no split.

  The call's `sow_weights=True` sows the attention weights `[..., heads,
  q_length, kv_length]` into 'intermediates' as 'attention_weights', as flax
  does (mechanisms that form the weights; see `multi_head.attention_weights`).
  """

  num_heads: int
  mechanism: Union[str, registry.Mechanism] = 'softmax'
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
  num_kv_heads: Optional[int] = None
  force_fp32_for_softmax: bool = False
  deterministic: Optional[bool] = None
  kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
  bias_init: Callable[..., Any] = nn.initializers.zeros_init()
  out_kernel_init: Optional[Callable[..., Any]] = None
  out_bias_init: Optional[Callable[..., Any]] = None
  use_bias: bool = True
  precision: Any = None
  normalize_qk: bool = False
  shared_params: Optional[Mapping[str, Any]] = None
  decode: bool = False
  rotary: bool = False
  sequence_axis: Optional[str] = None

  @nn.compact
  def __call__(
    self,
    inputs_q,
    inputs_k=None,
    inputs_v=None,
    *,
    inputs_kv=None,
    mask=None,
    deterministic: Optional[bool] = None,
    dropout_rng=None,
    sow_weights: bool = False,
    segment_ids=None,
    positions=None,
  ):
    """Attention over `inputs_q` `[..., q_length, features]` (self-attention, or over
    `inputs_k` / `inputs_v`); see the class docstring for the other arguments.

    segment_ids: `[..., length]` int, packed rows: documents are runs of equal non-zero
      ids, 0 is padding (docs/design.md, "Documents"); each token attends only to its
      own document. Mechanisms that declare `segments` only; self-attention; a mask
      beside them may only be key padding. In a decoding call, the tokens' ids: a row
      whose id differs from its last real token's starts a new document.
    positions: `[..., length]` int, the tokens' rotary positions (default: their
      positions in their documents, `ops.segments.positions`, else 0..length-1; in a
      decoding call, from the cache).
    """
    inputs_q, inputs_k, inputs_v = checks.resolve_inputs(inputs_q, inputs_k, inputs_v, inputs_kv)
    batch_shape = inputs_q.shape[:-2]
    return checks.with_one_batch_axis(
      lambda q, k, v, m, ids, pos: self._attend(
        q, k, v, m, deterministic, dropout_rng, sow_weights, batch_shape, ids, pos
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
    dropout_rng,
    sow_weights,
    batch_shape,
    segment_ids,
    positions,
  ):
    features = self.out_features or inputs_q.shape[-1]
    head_dim = head_shapes.head_dim(self.num_heads, self.qkv_features or inputs_q.shape[-1])
    # The mechanism is resolved once, by its module, and read from there below.
    mech = Mechanism(
      mechanism=self.mechanism,
      options=dict(self.options or {}),
      causal=self.causal,
      max_length=self.max_length,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      dropout_rate=self.dropout_rate,
      broadcast_dropout=self.broadcast_dropout,
      shared_params=self.shared_params,
      rotary=self.rotary,
      head_dim=head_dim,
      sequence_axis=self.sequence_axis,
      name='mechanism',
    )
    decl, options = mech.configured()
    checks.check_dropout(decl, self.dropout_rate)
    segment_ids, positions = checks.check_packed(
      decl,
      segment_ids,
      positions,
      mask=mask,
      inputs_q=inputs_q,
      inputs_k=inputs_k,
      inputs_v=inputs_v,
      projection=self.projection,
    )
    kv_heads = head_shapes.kv_heads(decl, self.projection, self.num_heads, self.num_kv_heads)
    shapes = head_shapes.head_layout(
      decl,
      options,
      projection=self.projection,
      heads=self.num_heads,
      head_dim=head_dim,
      kv_heads=kv_heads,
    )
    if self.dropout_rate > 0.0:  # as flax: only dropout needs to know
      deterministic = nn.merge_param('deterministic', self.deterministic, deterministic)
      if not deterministic and dropout_rng is None:  # drawn here, as flax draws it
        dropout_rng = self.make_rng('dropout')
    elif deterministic is None:
      deterministic = True if self.deterministic is None else self.deterministic
    stepping = self.decode and self.has_variable('cache', 'cache_index')
    if self.decode:
      checks.check_decode(mask, inputs_q, inputs_k, inputs_v, stepping, sow_weights)

    dense = lambda name: nn.DenseGeneral(
      features=shapes.features(name),
      axis=-1,
      kernel_init=self.kernel_init,
      bias_init=self.bias_init,
      use_bias=self.use_bias,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      name=name,
    )
    align = self._alignment() if self.projection == 'super' else None
    q, k, v = projections.project_qkv(
      self.projection,
      inputs_q,
      inputs_k,
      inputs_v,
      num_heads=self.num_heads,
      dense=dense,
      align=None if stepping else align,
      dtype=self.dtype,
      shared_qk=decl.shared_qk,
      normalize=self._qk_norm(),
      mask=mask,
      qkv_features=self.num_heads * head_dim,
    )
    # Captured with `apply(..., mutable=['attention_qkv'])` by the analysis tools; a
    # collection of its own, so flax's 'intermediates' hold only what flax puts there
    # (and not at init, which would put it among the variables).
    if not self.is_initializing():
      self.sow('attention_qkv', 'qkv', (q, k, v))

    if stepping:
      x = self._decode(mech, q, k, v, align, inputs_q, segment_ids, positions)
    else:
      if self.decode:
        self._init_cache(mech, q, v, inputs_q.shape[1], align)
      x = mech(
        q,
        k,
        v,
        mask=mask,
        deterministic=deterministic,
        dropout_rng=dropout_rng,
        sow_weights=sow_weights,
        force_fp32_for_softmax=self.force_fp32_for_softmax,
        inputs=inputs_q,
        segment_ids=segment_ids,
        positions=positions,
      )
      if sow_weights:
        x, weights = x
        self.sow(
          'intermediates', 'attention_weights', weights.reshape(batch_shape + weights.shape[1:])
        )
    return nn.DenseGeneral(
      features=features,
      axis=(-2, -1),
      kernel_init=self.out_kernel_init or self.kernel_init,
      bias_init=self.out_bias_init or self.bias_init,
      use_bias=self.use_bias,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      name='out',
    )(x)

  def _qk_norm(self):
    if not self.normalize_qk:
      return None
    return lambda name: nn.LayerNorm(
      use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype, name=name
    )

  def _alignment(self) -> projections.AlignmentKernel:
    return projections.alignment_kernel(self.max_length, self.causal, self.dtype, self.param_dtype)

  def _form(self, mech, inputs=None) -> decoding.DecodeForm:
    decl, options = mech.configured()
    return decoding.decode_form(
      decl,
      options,
      lambda state, q, k, v, tokens: mech(
        q,
        k,
        v,
        deterministic=True,
        state=state,
        position=tokens.positions,
        inputs=inputs,
        segment_ids=tokens.segment_ids,
      ),
    )

  def _init_cache(self, mech, q, v, length, align):
    """Creates the cache (the call that does so is the ordinary parallel forward)."""
    decl, options = mech.configured()
    b, _, _, dk = q.shape
    heads = head_shapes.state_heads(decl, options, self.num_heads, v.shape[2])  # v: the kv heads
    for name, value in cache_lib.init_cache(
      self._form(mech),
      batch=b,
      length=length,
      heads=heads,
      head_dim=dk,
      v_dim=v.shape[3],
      dtype=q.dtype,
      super_values=align is not None,
    ).items():
      self.put_variable('cache', name, value)

  def _decode(self, mech, q, k, v, align, inputs, segment_ids, positions):
    """A decoding call of n tokens (a step, or a prefill): the cache as Linen variables;
    `cache.decode` does the rest."""
    decl, _ = mech.configured()
    cache = {
      name: self.get_variable('cache', name)
      for name in cache_lib.CACHE_NAMES
      if self.has_variable('cache', name)
    }
    cache, x = cache_lib.decode(
      self._form(mech, inputs),
      cache,
      q,
      k,
      v,
      align_at=align,
      rotate_scores=self.rotary and decl.rotary == 'scores',
      segment_ids=segment_ids,
      positions=positions,
    )
    for name, value in cache.items():
      self.put_variable('cache', name, value)
    return x

"""Random-feature attention: RFA (trigonometric features) and Performer (FAVOR+).

Both replace exp(q . k) by phi(q) . phi(k) with random features phi and run the
shared kernel core `efficient_attn.ops.linear_attention`, so they
cost O(n m dv) time and O(n (m + dv) + m dv) memory per head for m features
(causal: chunked scan, see `causal_kernel_attention`), and decode in O(m dv) per token.

Shapes: q `[batch, q_length, heads, d]`, k `[batch, kv_length, heads, d]`,
v `[batch, kv_length, heads, dv]` -> `[batch, q_length, heads, dv]`; the random
projection W `[num_features, d]` is shared by all heads. Masks follow
`efficient_attn.ops.masking`; only their key-padding part is honoured.

Redraw policy (both mechanisms): by default the projection is FIXED per
layer, drawn from `feature_maps.fixed_feature_rng(seed, layer tag)`, i.e.
`PRNGKey(seed)` folded with zlib.crc32 of the layer's module path: no variable
collection, no state, and checkpoints restore exactly. With `redraw=True`, a
call with `deterministic=False` and an rng stream named 'features'
(`rngs={'features': key}`) draws a fresh projection; evaluation
(`deterministic=True`) always uses the fixed draw.
"""

import math
from typing import Optional, Union

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.kernel_family import CHUNK_SIZE
from efficient_attn.mechanisms.kernel_family import KernelMechanism
from efficient_attn.ops import feature_maps
from efficient_attn.ops import masking
from efficient_attn.ops import rotary
from efficient_attn.ops.linear_attention import KernelFeatures
from efficient_attn.ops.linear_attention import KernelState
from efficient_attn.ops.linear_attention import heads_as_batch
from efficient_attn.ops.linear_attention import kernel_attention
from efficient_attn.ops.linear_attention import kernel_attention_step
from efficient_attn.ops.linear_attention import platform_loops_rows
from efficient_attn.ops.scaled_dot_product import softmax_attention

Sigma = Union[float, jnp.ndarray]


# ----------------------------------------------------------------------------
# RFA.
# ----------------------------------------------------------------------------


def rfa_features(x: jnp.ndarray, projection: jnp.ndarray, sigma: Sigma = 1.0) -> jnp.ndarray:
  """RFA features of x: trig_features(x / (|x| sigma), W).

  x is l2-normalised along its last axis, then divided by sigma (a float, or an
  array broadcastable to x's leading axes, e.g. one per head `[heads]`), so
  phi(q) . phi(k) estimates exp(-|q^ - k^|^2 / (2 sigma^2)) =
  exp((q^ . k^ - 1) / sigma^2), proportional to exp(q^ . k^ / sigma^2).

  Args:
    x: `[..., heads, d]` (or any `[..., d]` with scalar sigma).
    projection: W `[D, d]`.
    sigma: kernel width.

  Returns:
    `[..., 2 D]` in float32 (or wider).
  """
  x = jnp.asarray(x)
  compute = jnp.promote_types(x.dtype, jnp.float32)
  x = x.astype(compute)
  x = x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-12)
  sigma = jnp.asarray(sigma, compute)
  x = x / sigma[..., None]
  return feature_maps.trig_features(x, projection)


def rfa_attention(
  q: jnp.ndarray,
  k: jnp.ndarray,
  v: jnp.ndarray,
  projection: jnp.ndarray,
  mask=None,
  causal: bool = False,
  eps: float = 1e-6,
  gate: Optional[jnp.ndarray] = None,
  sigma: Sigma = 1.0,
  chunk_size: Optional[int] = None,
  return_state: bool = False,
  positions=None,
  sequence_axis: Optional[str] = None,
):
  """Random feature attention (Peng et al. 2021).

      out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / safe(phi(q_i) . sum_j phi(k_j))

  with phi = `rfa_features` (l2-normalised inputs, width sigma, sin/cos
  features). It approximates softmax attention over the cosine similarities
  q^ . k^ / sigma^2. The trig features are sign-indefinite, so the estimated
  denominator may be ~0 or negative: it is clamped to `|den| >= eps` keeping its
  sign (`efficient_attn.ops.linear_attention.safe_denominator`), which keeps outputs and
  gradients finite.

  Recency gate (causal only, RFA-Gate): with g_t in (0, 1) per token and head,
  S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T and Z_t likewise, so older
  tokens are discounted geometrically; computed chunk-wise (see
  `efficient_attn.ops.linear_attention.chunk`).

  Time O(n D dv), memory O(n (D + dv) + D dv) per head.

  Args:
    q, k, v: see module docstring.
    projection: W `[D, d]` (e.g. `feature_maps.gaussian_projection`).
    mask: any `efficient_attn.ops.masking` form, reduced to key padding.
    causal: query i sees keys j <= i (needs q_length == kv_length).
    eps: denominator clamp.
    gate: optional `[batch, kv_length, heads]` in (0, 1); requires causal.
    sigma: kernel width, a float or per-head `[heads]`.
    chunk_size: causal chunk length (None: 64 on CPU, 256 on GPU and TPU).
    return_state: also return the final `KernelState` (prefill for decoding).
    positions: optional rotary (query, key) positions (see `linear_attention`).
    sequence_axis: one device's block of a sequence split over this mesh axis (see
      `efficient_attn.ops.linear_attention.sequence_parallel`).
  """
  k, v, kp = masking.checked_keys_values(q, k, v, mask, name='RFA attention', causal=causal)
  phi_q = rfa_features(q, projection, sigma)
  phi_k = rfa_features(k, projection, sigma)
  out, state = kernel_attention(
    KernelFeatures(phi_q, phi_k, **rotary.numerator(phi_q, phi_k, positions)),
    v,
    key_padding=kp,
    causal=causal,
    gate=gate,
    eps=eps,
    normalize=True,
    chunk_size=chunk_size,
    sequence_axis=sequence_axis,
  )
  return (out, state) if return_state else out


def rfa_attention_step(
  state: KernelState,
  q_t: jnp.ndarray,
  k_t: jnp.ndarray,
  v_t: jnp.ndarray,
  projection: jnp.ndarray,
  sigma: Sigma = 1.0,
  eps: float = 1e-6,
  gate_t: Optional[jnp.ndarray] = None,
  key_valid: Optional[jnp.ndarray] = None,
  position=None,
):
  """One decoding step of causal `rfa_attention` (optionally gated).

  Tokens `[batch, heads, d]` (or `[batch, 1, heads, d]`), gate_t `[batch, heads]`
  (or `[batch, 1, heads]`); the state comes from
  `init_kernel_state(batch, heads, 2 * D, dv)`. Returns (new_state, out_t), see
  `efficient_attn.ops.linear_attention.kernel_attention_step`. O(D dv) per (batch, head)
  and token.
  """
  phi_q, phi_k = rfa_features(q_t, projection, sigma), rfa_features(k_t, projection, sigma)
  return kernel_attention_step(
    state,
    KernelFeatures(phi_q, phi_k, **rotary.numerator(phi_q, phi_k, rotary.at(position))),
    v_t,
    eps=eps,
    normalize=True,
    gate_t=gate_t,
    key_valid=key_valid,
  )


# ----------------------------------------------------------------------------
# Performer (FAVOR+).
# ----------------------------------------------------------------------------


def performer_eps(dtype) -> float:
  """Performer's default denominator clamp for a compute dtype: tiny^(1/4).

  About 3e-10 in float32 (1e-77 in float64). Stabilised FAVOR+ denominators are
  measured relative to the largest key feature of the whole sequence, so they
  legitimately span many orders of magnitude (a query whose visible keys are all
  much smaller than that key has a tiny one), and a clamp like 1e-6 would
  distort such rows. With positive features the output is a convex combination
  of the values whatever the clamp, so the clamp only has to rule out 0/0
  (complete underflow: output 0) and keep gradients, which scale like
  max|v| / eps, and eps^2 (formed by XLA's rewrite of a / b / c) in range.
  """
  return float(jnp.finfo(jnp.promote_types(dtype, jnp.float32)).tiny) ** 0.25


def _scaled_queries_keys(q, k):
  """q and k times d^-1/4 (so that q . k is scaled by 1 / sqrt(d)), in float32 or wider."""
  d = q.shape[-1]
  compute = jnp.promote_types(jnp.result_type(q, k), jnp.float32)
  scale = d**-0.25
  return q.astype(compute) * scale, k.astype(compute) * scale


def performer_attention(
  q: jnp.ndarray,
  k: jnp.ndarray,
  v: jnp.ndarray,
  projection: jnp.ndarray,
  mask=None,
  causal: bool = False,
  eps: Optional[float] = None,
  chunk_size: Optional[int] = None,
  return_state: bool = False,
  positions=None,
  sequence_axis: Optional[str] = None,
):
  """Performer FAVOR+ attention (Choromanski et al. 2021).

  q and k are scaled by d^-1/4, so phi(q) . phi(k) with the positive features
  `feature_maps.positive_features` is an unbiased estimate of exp(q . k / sqrt(d))
  (up to the stabilisers, which cancel in the ratio), and the output estimates
  softmax(q k^T / sqrt(d)) v, increasingly well as num_features grows. The
  features are positive, so the denominator is >= 0; it is clamped to >= eps,
  by default the tiny `performer_eps(dtype)` (see there).

  The key stabiliser is one max per (batch, head) over all unpadded keys (under
  stop_gradient). In the causal form it therefore also looks at later keys, but
  it cancels exactly between numerator and denominator unless a denominator
  falls below eps (then the eps clamp, and only it, depends on later keys);
  gradients w.r.t. later positions are exactly zero.

  Time O(n m dv), memory O(n (m + dv) + m dv) per head.

  Args:
    q, k, v: see module docstring.
    projection: W `[m, d]`, e.g. `feature_maps.gaussian_projection(rng, m, d)`.
    mask: any `efficient_attn.ops.masking` form, reduced to key padding.
    causal: query i sees keys j <= i (needs q_length == kv_length).
    eps: denominator clamp (None: `performer_eps` of the compute dtype).
    chunk_size: causal chunk length (None: 64 on CPU, 256 on GPU and TPU).
    return_state: also return the final `KernelState`, whose log_scale is the
      key stabiliser (prefill for `performer_attention_step`).
    positions: optional rotary (query, key) positions (see `linear_attention`).
    sequence_axis: one device's block of a sequence split over this mesh axis (see
      `efficient_attn.ops.linear_attention.sequence_parallel`); the key stabiliser is
      then the maximum over every device's keys (`lax.pmax`), so the features are the
      unsplit sequence's.
  """
  k, v, kp = masking.checked_keys_values(q, k, v, mask, name='Performer attention', causal=causal)
  loop_rows = platform_loops_rows() and q.shape[0] * q.shape[2] > 1 and sequence_axis is None
  if (q.shape[2] > 1 and sequence_axis is None) or loop_rows:  # rows one at a time on CPU
    return heads_as_batch(
      performer_attention,
      q,
      k,
      v,
      kp,
      return_state,
      loop_rows=loop_rows,
      projection=projection,
      causal=causal,
      eps=eps,
      chunk_size=chunk_size,
      positions=positions,
    )
  qs, ks = _scaled_queries_keys(q, k)
  eps = performer_eps(qs.dtype) if eps is None else eps
  phi_q = feature_maps.positive_features(qs, projection, is_query=True)
  phi_k, stab = feature_maps.positive_features(
    ks,
    projection,
    is_query=False,
    key_padding=kp,
    return_stabilizer=True,
    stabilizer=None
    if sequence_axis is None
    else _key_stabilizer(ks, projection, kp, sequence_axis),
  )
  out, state = kernel_attention(
    KernelFeatures(phi_q, phi_k, **rotary.numerator(phi_q, phi_k, positions)),
    v,
    key_padding=kp,
    causal=causal,
    eps=eps,
    normalize=True,
    chunk_size=chunk_size,
    sequence_axis=sequence_axis,
  )
  if not return_state:
    return out
  log_scale = stab[:, 0, :, 0].astype(state.s.dtype)
  if kp is not None:
    log_scale = jnp.where(jnp.any(kp, axis=1)[:, None], log_scale, masking.big_neg(state.s.dtype))
  return out, state._replace(log_scale=log_scale)


def _key_stabilizer(ks, projection, key_padding, axis: str):
  """`feature_maps.positive_features`' key stabiliser `[b, 1, h, 1]` over the keys of every
  device on mesh axis `axis` (0 where all are padded), under stop_gradient."""
  a = feature_maps.positive_log_features(ks, projection)
  if key_padding is not None:
    a = jnp.where(key_padding[:, :, None, None], a, -jnp.inf)
  stab = lax.pmax(lax.stop_gradient(jnp.max(a, axis=(1, 3), keepdims=True)), axis)
  return jnp.where(jnp.isfinite(stab), stab, 0.0)


def performer_attention_step(
  state: KernelState,
  q_t: jnp.ndarray,
  k_t: jnp.ndarray,
  v_t: jnp.ndarray,
  projection: jnp.ndarray,
  eps: Optional[float] = None,
  key_valid: Optional[jnp.ndarray] = None,
  position=None,
):
  """One decoding step of causal `performer_attention`.

  A recurrent form cannot use the max over all keys, so the key stabiliser is a
  running max kept in `state.log_scale`: when a new key raises it from m to m',
  S and Z are rescaled by exp(m - m') (the online-softmax trick). The ratio is
  invariant to that common scale, so the outputs equal the parallel form's
  wherever no denominator is clamped by eps.

  Tokens `[batch, heads, d]` (or `[batch, 1, heads, d]`); the state comes from
  `init_kernel_state(batch, heads, m, dv)` or a `performer_attention(...,
  causal=True, return_state=True)` prefill. Returns (new_state, out_t).
  O(m dv) per (batch, head) and token.
  """
  q_token, keep_axis = (q_t[:, 0], True) if q_t.ndim == 4 else (q_t, False)
  k_token = k_t[:, 0] if k_t.ndim == 4 else k_t
  qs, ks = _scaled_queries_keys(q_token, k_token)
  eps = performer_eps(jnp.promote_types(qs.dtype, state.s.dtype)) if eps is None else eps
  phi_q = feature_maps.positive_features(qs, projection, is_query=True)
  a = feature_maps.positive_log_features(ks, projection)  # [b, h, m]
  compute = jnp.promote_types(a.dtype, state.s.dtype)
  a = a.astype(compute)
  neg = masking.big_neg(compute)
  if key_valid is not None:
    a = jnp.where(jnp.asarray(key_valid, bool)[:, None, None], a, -jnp.inf)
  old = state.log_scale.astype(compute)
  new = lax.stop_gradient(jnp.maximum(old, jnp.max(a, axis=-1)))  # [b, h]
  new = jnp.maximum(new, neg)
  ratio = jnp.exp(old - new)
  phi_k = jnp.exp(a - new[..., None]) * (1.0 / math.sqrt(projection.shape[0]))
  rescaled = KernelState(
    state.s * ratio[..., None, None].astype(state.s.dtype),
    state.z * ratio[..., None].astype(state.z.dtype),
    new.astype(state.log_scale.dtype),
  )
  new_state, out = kernel_attention_step(
    rescaled,
    KernelFeatures(phi_q, phi_k, **rotary.numerator(phi_q, phi_k, rotary.at(position))),
    v_t,
    eps=eps,
    normalize=True,
    key_valid=key_valid,
  )
  if keep_axis and out.ndim == 3:
    out = out[:, None]
  return new_state, out


# ----------------------------------------------------------------------------
# Declarations.
# ----------------------------------------------------------------------------


_FEATURE_OPTIONS = (
  registry.Option('orthogonal', True, bool, 'block-orthogonal projection rows'),
  registry.Option('redraw', False, bool, "fresh features in training calls given a 'features' rng"),
  registry.Option('seed', 0, int, 'seed of the fixed per-layer draw', minimum=0),
  CHUNK_SIZE,
)
_FEATURE_KNOB = ('num_features', (16, 32, 64, 128, 256, 512, 1024))


def _projection(options, head_dim: int, ctx):
  """The random projection `[num_features, head_dim]`: fresh (redraw) or the layer's fixed one."""
  key = ctx.rng('features') if options.redraw and not ctx.deterministic else None
  if key is not None:
    return lax.stop_gradient(
      feature_maps.gaussian_projection(
        key, options.num_features, head_dim, orthogonal=options.orthogonal
      )
    )
  # A compile-time constant, cached per layer.
  return feature_maps.fixed_projection(
    options.seed, ctx.tag, options.num_features, head_dim, options.orthogonal
  )


@registry.register
class RFA(KernelMechanism):
  """Learned parameters: 'gate_kernel' `[head_dim, heads]` and 'gate_bias' `[heads]`
  with `use_gate` (g_t = sigmoid(k_t . w_h + b_h)), 'log_sigma' `[heads]` with
  `learn_sigma`."""

  name = 'rfa'
  description = 'random feature attention, trigonometric features'
  citation = 'Peng et al. 2021'
  options = (
    registry.Option('num_features', 64, int, 'D random projections (2 D features)', minimum=1),
    registry.Option('sigma', 1.0, float, 'kernel width (initial value when learned)', above=0.0),
    registry.Option('learn_sigma', False, bool, 'learn log sigma per head'),
    registry.Option('use_gate', False, bool, 'RFA-Gate recency gate (causal only)'),
    registry.Option('gate_bias_init', 0.0, float, 'initial gate bias (larger: longer memory)'),
    registry.Option('eps', 1e-6, float, 'denominator clamp (|den| >= eps, sign kept)', above=0.0),
  ) + _FEATURE_OPTIONS
  random_features = True
  complexity = ('O(n D d)', 'O(n D + D d)')
  knob = _FEATURE_KNOB
  example = {'num_features': 16}

  def check(self, options, *, length, max_length, causal):
    if options.use_gate and not causal:
      raise ValueError(
        'option use_gate=True of mechanism \'rfa\' needs causal=True (the '
        'gate discounts earlier tokens of a prefix)'
      )

  def params(self, options, *, heads, head_dim, max_length, causal):
    out = {}
    if options.use_gate:
      out['gate_kernel'] = registry.ParamSpec((head_dim, heads), jax.nn.initializers.lecun_normal())
      out['gate_bias'] = registry.ParamSpec(
        (heads,), jax.nn.initializers.constant(options.gate_bias_init)
      )
    if options.learn_sigma:
      out['log_sigma'] = registry.ParamSpec(
        (heads,), jax.nn.initializers.constant(math.log(options.sigma))
      )
    return out

  def _gate_sigma(self, options, params, k):
    gate = None
    if options.use_gate:
      compute = jnp.promote_types(k.dtype, jnp.float32)
      logits = jnp.einsum(
        '...hd,dh->...h', k.astype(compute), params['gate_kernel'].astype(compute)
      )
      gate = jax.nn.sigmoid(logits + params['gate_bias'].astype(compute))
    sigma = (
      jnp.exp(params['log_sigma'].astype(jnp.float32)) if options.learn_sigma else options.sigma
    )
    return gate, sigma

  def reference(self, options, q, k, v):
    """Softmax over cosine similarities q^ . k^ / sigma^2 (what the features estimate)."""
    unit = lambda x: x * lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-12)
    return softmax_attention(unit(q), unit(k), v, scale=1.0 / options.sigma**2)

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    gate, sigma = self._gate_sigma(options, params, k)
    return rfa_attention(
      q,
      k,
      v,
      _projection(options, q.shape[-1], ctx),
      mask=mask,
      causal=causal,
      eps=options.eps,
      gate=gate,
      sigma=sigma,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
    )

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    gate, sigma = self._gate_sigma(options, params, k)
    return rfa_attention(
      q,
      k,
      v,
      _projection(options, q.shape[-1], ctx),
      mask=mask,
      causal=causal,
      eps=options.eps,
      gate=gate,
      sigma=sigma,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
      sequence_axis=axis,
    )

  def feature_dim(self, options, head_dim):
    return 2 * options.num_features  # cos and sin of D projections

  def grouped_state(self, options):
    return not (options.use_gate or options.learn_sigma)  # per-query-head gate or sigma

  def step(self, options, params, state, q_t, k_t, v_t, *, ctx):
    gate, sigma = self._gate_sigma(options, params, k_t)
    return rfa_attention_step(
      state,
      q_t,
      k_t,
      v_t,
      _projection(options, q_t.shape[-1], ctx),
      sigma=sigma,
      eps=options.eps,
      gate_t=gate,
      position=ctx.position,
    )


@registry.register
class Performer(KernelMechanism):
  name = 'performer'
  description = 'FAVOR+ with positive orthogonal random features'
  citation = 'Choromanski et al. 2021'
  options = (
    registry.Option('num_features', 64, int, 'm positive random features', minimum=1),
    registry.Option(
      'eps',
      None,
      float,
      'denominator clamp; None: tiny^(1/4) of the compute dtype',
      above=0.0,
      allow_none=True,
    ),
  ) + _FEATURE_OPTIONS
  random_features = True
  complexity = ('O(n m d)', 'O(n m + m d)')
  knob = _FEATURE_KNOB
  example = {'num_features': 16}

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return performer_attention(
      q,
      k,
      v,
      _projection(options, q.shape[-1], ctx),
      mask=mask,
      causal=causal,
      eps=options.eps,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
    )

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    return performer_attention(
      q,
      k,
      v,
      _projection(options, q.shape[-1], ctx),
      mask=mask,
      causal=causal,
      eps=options.eps,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
      sequence_axis=axis,
    )

  def feature_dim(self, options, head_dim):
    return options.num_features

  def grouped_state(self, options):
    return True  # one random projection for every head

  def step(self, options, params, state, q_t, k_t, v_t, *, ctx):
    return performer_attention_step(
      state,
      q_t,
      k_t,
      v_t,
      _projection(options, q_t.shape[-1], ctx),
      eps=options.eps,
      position=ctx.position,
    )

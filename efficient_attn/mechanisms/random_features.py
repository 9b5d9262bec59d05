"""Random-feature attention: RFA (trigonometric features) and Performer (FAVOR+).

Both replace exp(q . k) by phi(q) . phi(k) with random features phi and run the
shared kernel core `efficient_attn.mechanisms.linear.kernel_attention`, so they
cost O(n m dv) time and O(n (m + dv) + m dv) memory per head for m features
(causal: chunked scan, see `kernel_attention`), and decode in O(m dv) per token.

Shapes: q `[batch, q_length, heads, d]`, k `[batch, kv_length, heads, d]`,
v `[batch, kv_length, heads, dv]` -> `[batch, q_length, heads, dv]`; the random
projection W `[num_features, d]` is shared by all heads. Masks follow
`efficient_attn.masking`; only their key-padding part is honoured.

Redraw policy (both modules): by default the projection is FIXED per layer,
drawn from `feature_maps.fixed_feature_rng(seed, scope path)`, i.e.
`PRNGKey(seed)` folded with zlib.crc32 of `'/'.join(self.scope.path)`: no
variable collection, no state, and checkpoints restore exactly. With
`redraw=True`, a call with `deterministic=False` and an rng stream named
'features' (`rngs={'features': key}`) draws a fresh projection; evaluation
(`deterministic=True`) always uses the fixed draw.
"""
import math
from typing import Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from efficient_attn import feature_maps
from efficient_attn import masking
from efficient_attn.mechanisms.base import Mechanism
from efficient_attn.mechanisms.linear import KernelState
from efficient_attn.mechanisms.linear import init_kernel_state
from efficient_attn.mechanisms.linear import kernel_attention
from efficient_attn.mechanisms.linear import kernel_attention_step

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


def rfa_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, projection: jnp.ndarray,
                  mask=None, causal: bool = False, eps: float = 1e-6,
                  gate: Optional[jnp.ndarray] = None, sigma: Sigma = 1.0,
                  chunk_size: int = 64, return_state: bool = False):
  """Random feature attention (Peng et al. 2021).

      out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / safe(phi(q_i) . sum_j phi(k_j))

  with phi = `rfa_features` (l2-normalised inputs, width sigma, sin/cos
  features). It approximates softmax attention over the cosine similarities
  q^ . k^ / sigma^2. The trig features are sign-indefinite, so the estimated
  denominator may be ~0 or negative: it is clamped to |den| >= eps keeping its
  sign (`linear.safe_denominator`), which keeps outputs and gradients finite.

  Recency gate (causal only, RFA-Gate): with g_t in (0, 1) per token and head,
  S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T and Z_t likewise, so older
  tokens are discounted geometrically; computed chunk-wise (see
  `kernel_attention`).

  Time O(n D dv), memory O(n (D + dv) + D dv) per head.

  Args:
    q, k, v: see module docstring.
    projection: W `[D, d]` (e.g. `feature_maps.gaussian_projection`).
    mask: any `efficient_attn.masking` form, reduced to key padding.
    causal: query i sees keys j <= i (needs q_length == kv_length).
    eps: denominator clamp.
    gate: optional `[batch, kv_length, heads]` in (0, 1); requires causal.
    sigma: kernel width, a float or per-head `[heads]`.
    chunk_size: causal chunk length.
    return_state: also return the final `KernelState` (prefill for decoding).
  """
  b, lk = k.shape[0], k.shape[1]
  kp = masking.key_padding_from_mask(mask, b, lk)
  k = masking.zero_padded(k, kp)
  v = masking.zero_padded(v, kp)
  phi_q = rfa_features(q, projection, sigma)
  phi_k = rfa_features(k, projection, sigma)
  return kernel_attention(phi_q, phi_k, v, key_padding=kp, causal=causal, eps=eps,
                          normalize=True, chunk_size=chunk_size, gate=gate,
                          return_state=return_state)


def rfa_attention_step(state: KernelState, q_t: jnp.ndarray, k_t: jnp.ndarray,
                       v_t: jnp.ndarray, projection: jnp.ndarray, sigma: Sigma = 1.0,
                       eps: float = 1e-6, gate_t: Optional[jnp.ndarray] = None,
                       key_valid: Optional[jnp.ndarray] = None):
  """One decoding step of causal `rfa_attention` (optionally gated).

  Tokens `[batch, heads, d]` (or `[batch, 1, heads, d]`), gate_t `[batch, heads]`
  (or `[batch, 1, heads]`); the state comes from
  `init_kernel_state(batch, heads, 2 * D, dv)`. Returns (new_state, out_t), see
  `linear.kernel_attention_step`. O(D dv) per (batch, head) and token.
  """
  return kernel_attention_step(state, rfa_features(q_t, projection, sigma),
                               rfa_features(k_t, projection, sigma), v_t, eps=eps,
                               normalize=True, gate_t=gate_t, key_valid=key_valid)


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


def _performer_scale(q, k):
  d = q.shape[-1]
  compute = jnp.promote_types(jnp.result_type(q, k), jnp.float32)
  scale = d ** -0.25
  return q.astype(compute) * scale, k.astype(compute) * scale


def performer_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                        projection: jnp.ndarray, mask=None, causal: bool = False,
                        eps: Optional[float] = None, chunk_size: int = 64,
                        return_state: bool = False):
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
    mask: any `efficient_attn.masking` form, reduced to key padding.
    causal: query i sees keys j <= i (needs q_length == kv_length).
    eps: denominator clamp (None: `performer_eps` of the compute dtype).
    chunk_size: causal chunk length.
    return_state: also return the final `KernelState`, whose log_scale is the
      key stabiliser (prefill for `performer_attention_step`).
  """
  b, lk = k.shape[0], k.shape[1]
  kp = masking.key_padding_from_mask(mask, b, lk)
  k = masking.zero_padded(k, kp)
  v = masking.zero_padded(v, kp)
  qs, ks = _performer_scale(q, k)
  eps = performer_eps(qs.dtype) if eps is None else eps
  phi_q = feature_maps.positive_features(qs, projection, is_query=True)
  phi_k, stab = feature_maps.positive_features(ks, projection, is_query=False,
                                               key_padding=kp, return_stabilizer=True)
  res = kernel_attention(phi_q, phi_k, v, key_padding=kp, causal=causal, eps=eps,
                         normalize=True, chunk_size=chunk_size,
                         return_state=return_state)
  if not return_state:
    return res
  out, state = res
  log_scale = stab[:, 0, :, 0].astype(state.s.dtype)
  if kp is not None:
    log_scale = jnp.where(jnp.any(kp, axis=1)[:, None], log_scale,
                          masking.big_neg(state.s.dtype))
  return out, state._replace(log_scale=log_scale)


def performer_attention_step(state: KernelState, q_t: jnp.ndarray, k_t: jnp.ndarray,
                             v_t: jnp.ndarray, projection: jnp.ndarray,
                             eps: Optional[float] = None, key_valid: Optional[jnp.ndarray] = None):
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
  q_t_, keep_axis = (q_t[:, 0], True) if q_t.ndim == 4 else (q_t, False)
  k_t_ = k_t[:, 0] if k_t.ndim == 4 else k_t
  qs, ks = _performer_scale(q_t_, k_t_)
  eps = performer_eps(jnp.promote_types(qs.dtype, state.s.dtype)) if eps is None else eps
  phi_q = feature_maps.positive_features(qs, projection, is_query=True)
  a = feature_maps.positive_log_features(ks, projection)          # [b, h, m]
  compute = jnp.promote_types(a.dtype, state.s.dtype)
  a = a.astype(compute)
  neg = masking.big_neg(compute)
  if key_valid is not None:
    a = jnp.where(jnp.asarray(key_valid, bool)[:, None, None], a, -jnp.inf)
  old = state.log_scale.astype(compute)
  new = lax.stop_gradient(jnp.maximum(old, jnp.max(a, axis=-1)))   # [b, h]
  new = jnp.maximum(new, neg)
  ratio = jnp.exp(old - new)
  phi_k = jnp.exp(a - new[..., None]) * (1.0 / math.sqrt(projection.shape[0]))
  rescaled = KernelState(state.s * ratio[..., None, None].astype(state.s.dtype),
                         state.z * ratio[..., None].astype(state.z.dtype),
                         new.astype(state.log_scale.dtype))
  new_state, out = kernel_attention_step(rescaled, phi_q, phi_k, v_t, eps=eps,
                                         normalize=True, key_valid=key_valid)
  if keep_axis and out.ndim == 3:
    out = out[:, None]
  return new_state, out


# ----------------------------------------------------------------------------
# Linen modules.
# ----------------------------------------------------------------------------


class _HeadGate(nn.Module):
  """g = sigmoid(k . w_h + b_h) per head: `[..., heads, d] -> [..., heads]`."""
  bias_init: float = 0.0
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, k):
    h, d = k.shape[-2:]
    w = self.param('kernel', nn.initializers.lecun_normal(), (d, h), self.param_dtype)
    b = self.param('bias', nn.initializers.constant(self.bias_init), (h,),
                   self.param_dtype)
    compute = jnp.promote_types(k.dtype, jnp.float32)
    logits = jnp.einsum('...hd,dh->...h', k.astype(compute), w.astype(compute))
    return jax.nn.sigmoid(logits + b.astype(compute))


class _HeadLogSigma(nn.Module):
  """A learned log sigma per head, `[heads]`."""
  init_sigma: float = 1.0
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, heads: int):
    return self.param('log_sigma', nn.initializers.constant(math.log(self.init_sigma)),
                      (heads,), self.param_dtype)


class _RandomFeatureMechanism(Mechanism):
  """Shared projection handling (see the module docstring's redraw policy)."""

  def _projection(self, num_features: int, dim: int, deterministic: bool):
    if self.redraw and not deterministic and self.has_rng('features'):
      w = feature_maps.gaussian_projection(self.make_rng('features'), num_features, dim,
                                           orthogonal=self.orthogonal)
      return lax.stop_gradient(w)
    # The fixed draw is a compile-time constant (cached per layer).
    return feature_maps.fixed_projection(self.seed, tuple(self.scope.path), num_features,
                                         dim, self.orthogonal)

  def _prepare(self, q, k, v, deterministic: bool):
    """q, k, v in the compute dtype and the projection `[num_features, head_dim]`."""
    dtype = self.dtype or q.dtype
    q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
    return q, k, v, self._projection(self.num_features, q.shape[-1], deterministic)


class RFAAttention(_RandomFeatureMechanism):
  """Linen wrapper of `rfa_attention`.

  Attributes:
    num_features: D random projections (features have 2 D dimensions).
    sigma: kernel width (initial value when learned).
    learn_sigma: learn log sigma per head (param 'log_sigma/log_sigma', `[heads]`).
    use_gate: RFA-Gate recency gate, causal only: g_t = sigmoid(k_t . w_h + b_h)
      per head (params 'gate/kernel' `[d, heads]`, 'gate/bias' `[heads]`).
    gate_bias_init: initial gate bias (larger: longer memory).
    orthogonal: block-orthogonal projection rows (lower variance than i.i.d.).
    redraw: draw fresh features when `deterministic=False` and a 'features'
      rng is given; otherwise (and always in evaluation) the FIXED per-layer
      draw from `PRNGKey(seed)` folded with crc32 of the module path (no state;
      checkpoints restore exactly).
    seed: seed of the fixed draw.
    eps: denominator clamp (|den| >= eps, sign kept; trig features can give
      den <= 0).
    chunk_size: causal chunk length.

  Decoding: `init_state(batch, heads, head_dim, v_dim)` and
  `step(state, q_t, k_t, v_t)` (tokens `[batch, heads, dim]` or
  `[batch, 1, heads, dim]`); `step` reads the parameters created by `__call__`.
  """
  num_features: int = 128
  sigma: float = 1.0
  learn_sigma: bool = False
  use_gate: bool = False
  gate_bias_init: float = 0.0
  orthogonal: bool = True
  redraw: bool = False
  seed: int = 0
  eps: float = 1e-6
  chunk_size: int = 64

  def setup(self):
    if self.use_gate:
      if not self.causal:
        raise ValueError('RFAAttention: use_gate=True needs causal=True (the gate '
                         'discounts earlier tokens of a prefix)')
      self.gate = _HeadGate(bias_init=self.gate_bias_init, param_dtype=self.param_dtype)
    if self.learn_sigma:
      self.log_sigma = _HeadLogSigma(init_sigma=self.sigma, param_dtype=self.param_dtype)

  def _sigma(self, heads: int):
    if self.learn_sigma:
      return jnp.exp(self.log_sigma(heads).astype(jnp.float32))
    return self.sigma

  def __call__(self, q, k, v, mask=None, deterministic: bool = True):
    q, k, v, w = self._prepare(q, k, v, deterministic)
    gate = self.gate(k) if self.use_gate else None
    return rfa_attention(q, k, v, w, mask=mask, causal=self.causal, eps=self.eps,
                         gate=gate, sigma=self._sigma(q.shape[-2]),
                         chunk_size=self.chunk_size)

  def init_state(self, batch: int, heads: int, head_dim: int, v_dim: int,
                 dtype=jnp.float32) -> KernelState:
    del head_dim
    return init_kernel_state(batch, heads, 2 * self.num_features, v_dim, dtype)

  def step(self, state: KernelState, q_t, k_t, v_t, key_valid=None,
           deterministic: bool = True):
    """One causal decoding step with the fixed features: (new_state, out_t)."""
    del deterministic
    q_t, k_t, v_t, w = self._prepare(q_t, k_t, v_t, True)
    gate = self.gate(k_t) if self.use_gate else None
    return rfa_attention_step(state, q_t, k_t, v_t, w, sigma=self._sigma(q_t.shape[-2]),
                              eps=self.eps, gate_t=gate, key_valid=key_valid)


class PerformerAttention(_RandomFeatureMechanism):
  """Linen wrapper of `performer_attention` (FAVOR+), no parameters.

  Attributes:
    num_features: m positive random features.
    orthogonal: block-orthogonal projection rows with chi norms (FAVOR+).
    redraw: draw fresh features when `deterministic=False` and a 'features'
      rng is given; otherwise (and always in evaluation) the FIXED per-layer
      draw from `PRNGKey(seed)` folded with crc32 of the module path (no state;
      checkpoints restore exactly).
    seed: seed of the fixed draw.
    eps: denominator clamp (None: `performer_eps` of the compute dtype).
    chunk_size: causal chunk length.

  Decoding: `init_state(batch, heads, head_dim, v_dim)` and
  `step(state, q_t, k_t, v_t)` (tokens `[batch, heads, dim]` or
  `[batch, 1, heads, dim]`), see `performer_attention_step`.
  """
  num_features: int = 256
  orthogonal: bool = True
  redraw: bool = False
  seed: int = 0
  eps: Optional[float] = None
  chunk_size: int = 64

  def __call__(self, q, k, v, mask=None, deterministic: bool = True):
    q, k, v, w = self._prepare(q, k, v, deterministic)
    return performer_attention(q, k, v, w, mask=mask, causal=self.causal, eps=self.eps,
                               chunk_size=self.chunk_size)

  def init_state(self, batch: int, heads: int, head_dim: int, v_dim: int,
                 dtype=jnp.float32) -> KernelState:
    del head_dim
    return init_kernel_state(batch, heads, self.num_features, v_dim, dtype)

  def step(self, state: KernelState, q_t, k_t, v_t, key_valid=None,
           deterministic: bool = True):
    """One causal decoding step with the fixed features: (new_state, out_t)."""
    del deterministic
    q_t, k_t, v_t, w = self._prepare(q_t, k_t, v_t, True)
    return performer_attention_step(state, q_t, k_t, v_t, w, eps=self.eps,
                                    key_valid=key_valid)

"""What the forms of kernel attention share: the features, the inputs' preparation, the
safe denominator.

Denominator: `safe_denominator` clamps |den| >= eps keeping its sign (max(den, eps) for
non-negative features). Unlike den + eps this leaves the output exactly invariant to a
common rescaling of the key features whenever |den| >= eps (so Performer's key
stabiliser cancels exactly, in parallel and recurrent forms alike), and it never divides
by ~0 for the sign-indefinite trigonometric (RFA) features, whose estimated denominator
may be <= 0: the output is bounded by |numerator| / eps and keeps the numerator's sign.
"""

from typing import NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from efficient_attn.ops import masking
from efficient_attn.ops import rotary


class KernelFeatures(NamedTuple):
  """The query and key features of kernel attention (a pytree of arrays).

  The numerator is num_q^T sum_j num_k_j v_j^T and the denominator phi_q . sum_j phi_k_j.

  Attributes:
    phi_q: `[batch, q_length, heads, f]` query features (one decoding step: `[batch,
      heads, f]` or `[batch, 1, heads, f]`).
    phi_k: `[batch, kv_length, heads, f]` key features (one step: like phi_q).
    num_q, num_k: optional numerator features shaped like phi_q, phi_k (RoFormer's
      rotary linear attention, Su et al. 2021: rotated features above, unrotated below;
      `efficient_attn.ops.rotary.numerator` gives them by these names). None: phi_q, phi_k.
  """

  phi_q: jnp.ndarray
  phi_k: jnp.ndarray
  num_q: Optional[jnp.ndarray] = None
  num_k: Optional[jnp.ndarray] = None

  @property
  def has_numerator(self) -> bool:
    """Whether the numerator has features of its own."""
    return self.num_q is not None or self.num_k is not None

  def numerator(self) -> Tuple[jnp.ndarray, jnp.ndarray]:
    """(num_q, num_k), each defaulting to phi_q, phi_k."""
    return (
      self.phi_q if self.num_q is None else self.num_q,
      self.phi_k if self.num_k is None else self.num_k,
    )


def rotary_features(phi_q: jnp.ndarray, phi_k: jnp.ndarray, positions) -> KernelFeatures:
  """`KernelFeatures` of phi_q, phi_k whose numerator features are phi_q, phi_k rotated at
  `positions` = (query positions, key positions), RoFormer's rotary linear attention (Su et
  al. 2021; `efficient_attn.ops.rotary.numerator`); no numerator features when `positions`
  is None."""
  return KernelFeatures(phi_q, phi_k, **rotary.numerator(phi_q, phi_k, positions))


def compute_dtype(*arrays) -> jnp.dtype:
  """The arrays' common dtype, float32 or wider."""
  return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


def safe_denominator(den: jnp.ndarray, eps: float) -> jnp.ndarray:
  """den with |den| clamped to >= eps, keeping its sign (0 counts as positive)."""
  return jnp.where(den >= 0, jnp.maximum(den, eps), jnp.minimum(den, -eps))


@jax.custom_jvp
def _divide(num, den):
  return num / den


@_divide.defjvp
def _divide_jvp(primals, tangents):
  # d(n/d) = (dn - out dd) / d: never forms d^2, which underflows for the tiny
  # (but clamped) denominators of stabilised positive features.
  num, den = primals
  d_num, d_den = tangents
  out = num / den
  return out, (d_num - out * d_den) / den


def normalize_by(num: jnp.ndarray, den: jnp.ndarray, eps: float) -> jnp.ndarray:
  """num `[..., dv]` / safe_denominator(den `[...]`, eps), with a stable gradient."""
  return _divide(num, safe_denominator(den, eps)[..., None])


def log_decay(gate: jnp.ndarray, dtype) -> jnp.ndarray:
  """log g of a gate g in (0, 1), clipped to [log tiny, 0] so that it stays finite."""
  gate = gate.astype(dtype)
  return jnp.log(jnp.clip(gate, jnp.finfo(dtype).tiny, 1.0))


def prepare(
  features: KernelFeatures,
  v: jnp.ndarray,
  key_padding: Optional[jnp.ndarray] = None,
  gate: Optional[jnp.ndarray] = None,
):
  """The inputs of a form, in the compute dtype (float32 or wider), keys masked and gated.

  Args:
    features: `KernelFeatures` of `[batch, length, heads, f]` arrays.
    v: `[batch, kv_length, heads, dv]`.
    key_padding: optional bool `[batch, kv_length]`, True = real key. Padded keys
      contribute nothing: their features and values are zeroed (and with a gate they
      do not decay the state).
    gate: optional `[batch, kv_length, heads]` in (0, 1): the key features are scaled by
      1 - g (S_t = g_t S_{t-1} + (1 - g_t) phi_k_t v_t^T).

  Returns:
    (features, v, log decay `[batch, kv_length, heads]` or None without a gate).
  """
  compute = compute_dtype(*(x for x in features if x is not None), v)
  phi_q, phi_k = features.phi_q.astype(compute), features.phi_k.astype(compute)
  num_q, num_k = (
    None if x is None else x.astype(compute) for x in (features.num_q, features.num_k)
  )
  v = v.astype(compute)
  b, _, h, f = phi_q.shape
  lk = phi_k.shape[1]
  if (
    phi_k.shape != (b, lk, h, f)
    or v.shape[:3] != (b, lk, h)
    or (num_q is not None and num_q.shape != phi_q.shape)
    or (num_k is not None and num_k.shape != phi_k.shape)
  ):
    num_q_shape, num_k_shape = (x.shape for x in features.numerator())
    raise ValueError(
      f'inconsistent shapes phi_q {phi_q.shape}, phi_k {phi_k.shape}, '
      f'v {v.shape}, num_q {num_q_shape}, num_k {num_k_shape}'
    )
  log_g = None
  if gate is not None:
    log_g = log_decay(gate, compute)
    phi_k = phi_k * (1.0 - gate.astype(compute))[..., None]
    num_k = None if num_k is None else num_k * (1.0 - gate.astype(compute))[..., None]
  if key_padding is not None:
    key_padding = jnp.asarray(key_padding, bool)
    phi_k = masking.zero_padded(phi_k, key_padding)
    num_k = None if num_k is None else masking.zero_padded(num_k, key_padding)
    v = masking.zero_padded(v, key_padding)
    if log_g is not None:
      log_g = masking.zero_padded(log_g, key_padding)
  return KernelFeatures(phi_q, phi_k, num_q, num_k), v, log_g

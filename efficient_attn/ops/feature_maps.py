"""Feature maps phi for kernelised attention: sim(q, k) = phi(q) . phi(k).

Deterministic maps (linear attention, Katharopoulos et al. 2020) act
element-wise and keep the last dimension:

  * `elu_plus_one`: elu(x) + 1 (positive, the linear transformer's default);
  * `relu`: max(x, 0) (non-negative; a row may be all zero);
  * `identity`: x (sign-indefinite; the softmax-free "linear attention");

and one widens it:

  * `taylor`: the second-order Taylor expansion of exp (Zhang et al. 2024,
    "Hedgehog"; Arora et al. 2024, "Based"): [1, x / d^(1/4), vec(x x^T) /
    sqrt(2 d)], `[..., d] -> [..., 1 + d + d^2]`, whose dot product is
    1 + s + s^2 / 2 for s = q . k / sqrt(d) (never below 1/2).

`get_feature_map(name)` looks them up by the names 'elu', 'relu', 'identity',
'taylor'; `feature_dim(name, d)` is the width of their features.

Random features approximate the exponential kernel exp(q . k) and therefore
softmax attention:

  * `gaussian_projection`: the random matrix W `[num_features, dim]`, plain
    Gaussian or block-orthogonal with chi-distributed row norms (FAVOR+);
  * `trig_features`: RFA (Peng et al. 2021) sqrt(1/D) [sin(W x), cos(W x)],
    whose dot product estimates exp(-|x - y|^2 / 2) (sign-indefinite);
  * `positive_features`: FAVOR+ (Choromanski et al. 2021)
    exp(W x - |x|^2 / 2 - stabiliser) / sqrt(m), whose dot product estimates
    exp(x . y) up to the stabilisers (always >= 0);
  * `fixed_feature_rng` / `fixed_projection`: the key and the (cached) draw a
    module uses for its fixed features.

Every map returns float32 (or wider) features whatever the input dtype, so
bfloat16 inputs are featurised and accumulated in float32.
"""

import functools
import math
from typing import Callable, Dict, Optional, Sequence
import zlib

import jax
from jax import lax
import jax.numpy as jnp

FeatureMap = Callable[[jnp.ndarray], jnp.ndarray]


def _compute_dtype(x) -> jnp.dtype:
  return jnp.promote_types(jnp.asarray(x).dtype, jnp.float32)


def elu_plus_one(x: jnp.ndarray) -> jnp.ndarray:
  """elu(x) + 1 element-wise: `[..., d] -> [..., d]`, strictly positive."""
  x = jnp.asarray(x)
  return jax.nn.elu(x.astype(_compute_dtype(x))) + 1.0


def relu(x: jnp.ndarray) -> jnp.ndarray:
  """max(x, 0) element-wise: `[..., d] -> [..., d]`, non-negative."""
  x = jnp.asarray(x)
  return jax.nn.relu(x.astype(_compute_dtype(x)))


def identity(x: jnp.ndarray) -> jnp.ndarray:
  """x itself (cast to float32 or wider): `[..., d] -> [..., d]`."""
  x = jnp.asarray(x)
  return x.astype(_compute_dtype(x))


def taylor(x: jnp.ndarray) -> jnp.ndarray:
  """Second-order Taylor features of exp(q . k / sqrt(d)): `[..., d] -> [..., 1 + d + d^2]`.

  [1, x / d^(1/4), vec(x x^T) / sqrt(2 d)] (Zhang et al. 2024; Arora et al. 2024's Based),
  so phi(q) . phi(k) = 1 + s + s^2 / 2 with s = q . k / sqrt(d): a positive kernel (its
  minimum is 1/2, at s = -1), so a normalised attention row never divides by ~0. The
  width grows as d^2: Based keeps d at 16 (273 features).
  """
  x = jnp.asarray(x)
  x = x.astype(_compute_dtype(x))
  d = x.shape[-1]
  outer = (x[..., :, None] * x[..., None, :]).reshape(x.shape[:-1] + (d * d,))
  return jnp.concatenate(
    [jnp.ones(x.shape[:-1] + (1,), x.dtype), x * d**-0.25, outer * (2.0 * d) ** -0.5], axis=-1
  )


FEATURE_MAPS: Dict[str, FeatureMap] = {
  'elu': elu_plus_one,
  'relu': relu,
  'identity': identity,
  'taylor': taylor,
}
# The width of each map's features from the width d of its input (default: d).
_FEATURE_DIMS: Dict[str, Callable[[int], int]] = {'taylor': lambda d: 1 + d + d * d}


def feature_dim(name: str, dim: int) -> int:
  """The width of the features of the map called `name` for inputs of width `dim`."""
  get_feature_map(name)  # an unknown name: the ValueError listing the valid ones
  return _FEATURE_DIMS.get(name, lambda d: d)(dim)


def get_feature_map(name: str) -> FeatureMap:
  """The deterministic feature map called `name` ('elu', 'relu', 'identity', 'taylor').

  Raises:
    ValueError: for an unknown name, listing the valid ones.
  """
  if name not in FEATURE_MAPS:
    raise ValueError(f'Unknown feature map {name!r}; valid feature maps: {", ".join(FEATURE_MAPS)}')
  return FEATURE_MAPS[name]


# ----------------------------------------------------------------------------
# Random features.
# ----------------------------------------------------------------------------


def fixed_feature_rng(seed: int, path: Sequence[str]) -> jax.Array:
  """The key of a module's fixed random-feature draw.

  `jax.random.PRNGKey(seed)` folded with the CRC-32 of `'/'.join(path)` (the
  module's scope path), so every layer gets its own draw, the same on every
  call, in every process and after a checkpoint restore, with no stored state.
  """
  tag = zlib.crc32('/'.join(str(p) for p in path).encode('utf-8')) & 0x7FFFFFFF
  return jax.random.fold_in(jax.random.PRNGKey(seed), tag)


@functools.lru_cache(maxsize=256)
def fixed_projection(
  seed: int, path: Sequence[str], num_features: int, dim: int, orthogonal: bool = True
) -> jax.Array:
  """`gaussian_projection(fixed_feature_rng(seed, path), num_features, dim)`, float32.

  Computed eagerly even while a caller is being traced (the inputs are all
  static) and cached, so a model's compiled program holds the draw as a
  constant instead of re-running the random number generator and QR; `path`
  must be a tuple.
  """
  with jax.ensure_compile_time_eval():
    return gaussian_projection(
      fixed_feature_rng(seed, path), num_features, dim, orthogonal=orthogonal
    )


@functools.partial(jax.jit, static_argnames=('num_features', 'dim', 'orthogonal', 'dtype'))
def gaussian_projection(
  rng: jax.Array, num_features: int, dim: int, orthogonal: bool = True, dtype=jnp.float32
) -> jnp.ndarray:
  """Random projection W `[num_features, dim]` with rows w_i ~ N(0, I_dim).

  With `orthogonal=True` (FAVOR+'s orthogonal random features) the rows come in
  blocks of `dim`: each block is a Haar-random orthogonal matrix (QR of a
  Gaussian matrix, signs fixed by diag(R)), and each row is rescaled by an
  independent chi_dim-distributed norm, so every row is still marginally
  N(0, I_dim) while the rows of a block are exactly orthogonal. The last block is
  truncated when `dim` does not divide `num_features`. With `orthogonal=False`
  the rows are i.i.d. Gaussian.

  Time O(num_features * dim^2), memory O(num_features * dim).
  """
  if num_features <= 0 or dim <= 0:
    raise ValueError(f'num_features and dim must be positive, got {num_features}, {dim}')
  if not orthogonal:
    return jax.random.normal(rng, (num_features, dim), dtype)
  num_blocks = -(-num_features // dim)
  # One Gaussian draw (threefry is slow to compile): blocks for the QR, then
  # independent vectors whose norms are chi_dim distributed.
  g = jax.random.normal(rng, (2 * num_blocks, dim, dim), jnp.float32)
  q, r = jnp.linalg.qr(g[:num_blocks])  # orthonormal columns
  signs = jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))
  signs = jnp.where(signs == 0, 1.0, signs)
  q = q * signs[:, None, :]  # Haar-distributed
  rows = jnp.swapaxes(q, -1, -2).reshape(num_blocks * dim, dim)[:num_features]
  norms = jnp.linalg.norm(g[num_blocks:].reshape(num_blocks * dim, dim)[:num_features], axis=-1)
  return (rows * norms[:, None]).astype(dtype)


def _project(x: jnp.ndarray, projection: jnp.ndarray) -> jnp.ndarray:
  x = jnp.asarray(x)
  compute = jnp.promote_types(_compute_dtype(x), projection.dtype)
  if projection.ndim != 2 or projection.shape[-1] != x.shape[-1]:
    raise ValueError(f'projection must be [num_features, {x.shape[-1]}], got {projection.shape}')
  return jnp.einsum('...d,md->...m', x.astype(compute), projection.astype(compute))


def trig_features(x: jnp.ndarray, projection: jnp.ndarray) -> jnp.ndarray:
  """RFA's random Fourier features sqrt(1/D) [sin(W x), cos(W x)].

  phi(x) . phi(y) = (1/D) sum_i cos(w_i . (x - y)), an unbiased estimate of the
  Gaussian kernel exp(-|x - y|^2 / 2) for w_i ~ N(0, I). Features are bounded but
  sign-indefinite, so sums of them (attention denominators) may be <= 0.

  Args:
    x: `[..., dim]`.
    projection: W `[D, dim]`.

  Returns:
    `[..., 2 D]` in float32 (or wider). Time O(D dim) per row.
  """
  wx = _project(x, projection)
  scale = math.sqrt(1.0 / projection.shape[0])
  return jnp.concatenate([jnp.sin(wx), jnp.cos(wx)], axis=-1) * scale


def positive_log_features(x: jnp.ndarray, projection: jnp.ndarray) -> jnp.ndarray:
  """The exponents W x - |x|^2 / 2 of FAVOR+ features: `[..., dim] -> [..., m]`."""
  wx = _project(x, projection)
  sq = 0.5 * jnp.sum(jnp.square(jnp.asarray(x).astype(wx.dtype)), axis=-1, keepdims=True)
  return wx - sq


def positive_features(
  x: jnp.ndarray,
  projection: jnp.ndarray,
  is_query: bool,
  key_padding: Optional[jnp.ndarray] = None,
  stabilizer: Optional[jnp.ndarray] = None,
  return_stabilizer: bool = False,
):
  """FAVOR+ positive random features exp(W x - |x|^2/2 - stabiliser) / sqrt(m).

  E[phi(x) . phi(y)] = exp(x . y) exp(-s_x - s_y) for rows w_i ~ N(0, I). The
  stabilisers s are data-dependent constants computed under `stop_gradient`:

    * queries: the max over the m features of each row. It multiplies a whole
      attention row, so it cancels between numerator and denominator;
    * keys: one max over all (unpadded) keys and all features per (batch, head).
      It multiplies every key of a (batch, head) alike, so it cancels too.

  Hence every feature is exp(<= 0) <= 1/sqrt(m): never inf, and at least one
  feature per query row (and per (batch, head) of keys) equals 1/sqrt(m), so
  large-norm inputs do not underflow to an all-zero row.

  Args:
    x: queries: any `[..., dim]`; keys: `[batch, length, heads, dim]` (the
      stabiliser reduces over axes 1 and -1).
    projection: W `[m, dim]`.
    is_query: selects the stabiliser.
    key_padding: optional bool `[batch, length]` (keys only), True = real key.
      Padded keys get features exactly 0 and are left out of the stabiliser.
    stabilizer: optional explicit stabiliser broadcastable to `[..., m]`
      (used by recurrent decoding, which cannot look at future keys); the
      caller then guarantees the exponents stay small enough not to overflow.
    return_stabilizer: also return the stabiliser used.

  Returns:
    features `[..., m]` in float32 (or wider), and the stabiliser (query:
    `[..., 1]`; key: `[batch, 1, heads, 1]`, 0 where every key is padded) if
    `return_stabilizer`. Time O(m dim) per row.
  """
  a = positive_log_features(x, projection)
  if key_padding is not None:
    if is_query:
      raise ValueError('key_padding applies to keys only (is_query=False)')
    a = jnp.where(jnp.asarray(key_padding, bool)[:, :, None, None], a, -jnp.inf)
  if stabilizer is None:
    if is_query:
      stabilizer = jnp.max(a, axis=-1, keepdims=True)
    else:
      if a.ndim != 4:
        raise ValueError(f'keys must be [batch, length, heads, dim], got {x.shape}')
      stabilizer = jnp.max(a, axis=(1, 3), keepdims=True)
    stabilizer = jnp.where(jnp.isfinite(stabilizer), stabilizer, 0.0)
  stabilizer = lax.stop_gradient(jnp.asarray(stabilizer, a.dtype))
  phi = jnp.exp(a - stabilizer) * (1.0 / math.sqrt(projection.shape[0]))
  if return_stabilizer:
    return phi, stabilizer
  return phi

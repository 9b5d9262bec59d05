"""The published algorithms the library is timed against (`benchmarks.peers`).

Written here from the papers and their public reference code, in the few lines
each takes, with nothing of the library: they are what a researcher would
otherwise use. Inputs are q, k `[batch, length, heads, d]`, v `[batch, length,
heads, dv]`; outputs `[batch, length, heads, dv]`.

  exact              `jax.nn.dot_product_attention` (XLA), the dense n x n form.
  linear             elu+1 linear attention (Katharopoulos et al. 2020), textbook.
  linear_causal      the same with the prefix sums of k (x) v taken by `cumsum`.
  favor              FAVOR+ (Choromanski et al. 2021) as google-research's
                     `performer/fast_attention/jax` computes it: positive softmax
                     features with its stabilisers, length-major einsums.
  favor_causal       its unidirectional form: a scan over positions with the
                     reference's hand-written backward scan.
  linformer          LRA's Linformer core: keys and values projected along the
                     length by one [n, k] matrix each, then softmax attention.
  nystromformer      Xiong et al. (2021)'s reference: segment-mean landmarks,
                     three softmax kernels, the iterative pseudo-inverse.
"""

import jax
from jax import lax
import jax.numpy as jnp


def exact(q, k, v, causal=False):
  return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation='xla')


def _elu1(x):
  return jax.nn.elu(x) + 1.0


def linear(q, k, v, eps=1e-6):
  q, k = _elu1(q), _elu1(k)
  kv = jnp.einsum('bnhd,bnhe->bhde', k, v)
  num = jnp.einsum('bnhd,bhde->bnhe', q, kv)
  den = jnp.einsum('bnhd,bhd->bnh', q, k.sum(axis=1))
  return num / (den[..., None] + eps)


def linear_causal(q, k, v, eps=1e-6):
  q, k = _elu1(q), _elu1(k)
  s = jnp.cumsum(jnp.einsum('bnhd,bnhe->bnhde', k, v), axis=1)
  z = jnp.cumsum(k, axis=1)
  num = jnp.einsum('bnhd,bnhde->bnhe', q, s)
  return num / (jnp.einsum('bnhd,bnhd->bnh', q, z)[..., None] + eps)


def favor_features(x, projection, is_query, eps=1e-6):
  """The reference's softmax_kernel_transformation: `[b, n, h, m]`."""
  d, m = x.shape[-1], projection.shape[0]
  normalizer = d**-0.25
  dash = jnp.einsum('bnhd,md->bnhm', normalizer * x, projection)
  diag = 0.5 * normalizer**2 * jnp.sum(x**2, axis=-1, keepdims=True)
  stab = (
    jnp.max(dash, axis=-1, keepdims=True) if is_query else jnp.max(dash, axis=(1, 3), keepdims=True)
  )
  return m**-0.5 * (jnp.exp(dash - diag - lax.stop_gradient(stab)) + eps)


def favor(q, k, v, projection):
  qp, kp = favor_features(q, projection, True), favor_features(k, projection, False)
  qp, kp, vl = (jnp.moveaxis(x, 1, 0) for x in (qp, kp, v))  # length-major, as the reference
  kvs = jnp.einsum('lbhm,lbhd->bhmd', kp, vl)
  num = jnp.einsum('lbhm,bhmd->lbhd', qp, kvs)
  den = jnp.einsum('lbhm,bhm->lbh', qp, kp.sum(axis=0))
  return jnp.moveaxis(num / den[..., None], 0, 1)


@jax.custom_vjp
def _prefix_products(qs, ks, vs):
  """out_t = q_t . sum_{s<=t} k_s (x) v_s over length-major `[l, b, h, .]` arrays."""
  return _prefix_fwd(qs, ks, vs)[0]


def _prefix_fwd(qs, ks, vs):
  def body(p, x):
    q, k, v = x
    p = p + jnp.einsum('bhm,bhd->bhmd', k, v)
    return p, jnp.einsum('bhm,bhmd->bhd', q, p)

  init = jnp.zeros(ks.shape[1:] + vs.shape[-1:], qs.dtype)
  p, out = lax.scan(body, init, (qs, ks, vs))
  return out, (qs, ks, vs, p)


def _prefix_bwd(res, g):
  qs, ks, vs, p = res

  def body(carry, x):
    p, gp = carry
    q, k, v, gt = x
    gq = jnp.einsum('bhd,bhmd->bhm', gt, p)
    gp = gp + jnp.einsum('bhm,bhd->bhmd', q, gt)
    gk = jnp.einsum('bhmd,bhd->bhm', gp, v)
    gv = jnp.einsum('bhmd,bhm->bhd', gp, k)
    return (p - jnp.einsum('bhm,bhd->bhmd', k, v), gp), (gq, gk, gv)

  _, (gq, gk, gv) = lax.scan(body, (p, jnp.zeros_like(p)), (qs, ks, vs, g), reverse=True)
  return gq, gk, gv


_prefix_products.defvjp(_prefix_fwd, _prefix_bwd)


def favor_causal(q, k, v, projection):
  qp, kp = favor_features(q, projection, True), favor_features(k, projection, False)
  qp, kp, vl = (jnp.moveaxis(x, 1, 0) for x in (qp, kp, v))
  num = _prefix_products(qp, kp, vl)
  den = _prefix_products(qp, kp, jnp.ones(vl.shape[:-1] + (1,), vl.dtype))
  return jnp.moveaxis(num / den, 0, 1)


def linformer(q, k, v, e, f):
  """e, f `[n, k_proj]`: the length projections of keys and values."""
  kp = jnp.einsum('bnhd,nk->bkhd', k, e)
  vp = jnp.einsum('bnhd,nk->bkhd', v, f)
  return jax.nn.dot_product_attention(q, kp, vp, implementation='xla')


def _iterative_inv(mat, n_iter=6):
  eye = jnp.eye(mat.shape[-1], dtype=mat.dtype)
  v = mat.swapaxes(-1, -2) / (jnp.max(jnp.sum(mat, axis=-2)) * jnp.max(jnp.sum(mat, axis=-1)))
  for _ in range(n_iter):
    kv = mat @ v
    v = 0.25 * v @ (13 * eye - kv @ (15 * eye - kv @ (7 * eye - kv)))
  return v


def nystromformer(q, k, v, num_landmarks=64, n_iter=6):
  b, n, h, d = q.shape
  q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [b, h, n, d] as the reference
  q, k = q * d**-0.25, k * d**-0.25
  seg = n // num_landmarks
  ql = q.reshape(b, h, num_landmarks, seg, d).mean(axis=-2)
  kl = k.reshape(b, h, num_landmarks, seg, d).mean(axis=-2)
  k1 = jax.nn.softmax(q @ kl.swapaxes(-1, -2), axis=-1)
  k2 = jax.nn.softmax(ql @ kl.swapaxes(-1, -2), axis=-1)
  k3 = jax.nn.softmax(ql @ k.swapaxes(-1, -2), axis=-1)
  out = (k1 @ _iterative_inv(k2, n_iter)) @ (k3 @ v)
  return jnp.swapaxes(out, 1, 2)

"""Float64 NumPy references and inputs shared by the sparse-pattern mechanism tests.

Used by test_bigbird, test_longformer, test_sparse and test_fnet: each test
builds its mechanism's boolean pattern explicitly and compares with
`np_masked_attention`, the dense masked softmax.
"""

from helpers import PAD
from helpers import value_and_grads
import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import numpy as np


def inputs(seed=0, b=2, n=16, h=2, d=4, dv=3, dtype=np.float64, scale=1.0):
  """q `[b, n, h, d]`, k `[b, n, h, d]`, v `[b, n, h, dv]` as NumPy arrays."""
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, n, h, d)) * scale
  k = rng.normal(size=(b, n, h, d)) * scale
  v = rng.normal(size=(b, n, h, dv))
  return tuple(x.astype(dtype) for x in (q, k, v))


def padding(n):
  """Key padding `[2, n]`: `helpers.PAD` repeated (row 1 has padded runs 6-9, 16-19, ...)."""
  return np.tile(PAD, (1, -(-n // PAD.shape[1])))[:, :n]


def with_noise_at_padding(x, pad, seed=1):
  """`x` `[b, n, ...]` with large random values at the padded positions of `pad`."""
  x = np.array(x, copy=True)
  noise = 1e3 * np.random.default_rng(seed).normal(size=x.shape)
  x[~pad] = noise[~pad].astype(x.dtype)
  return x


def np_masked_attention(q, k, v, allowed, key_padding=None, scale=None):
  """Dense softmax attention in float64 where `allowed` (and `key_padding`) hold.

  Args:
    q, k, v: `[b, n, h, d]`, `[b, n, h, d]`, `[b, n, h, dv]`.
    allowed: bool broadcastable to `[b, h, n, n]`, True where query i may see key j.
    key_padding: optional bool `[b, n]`, True for real keys.
    scale: default 1 / sqrt(d).

  Returns:
    `[b, n, h, dv]`; rows with no allowed key are 0.
  """
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, n, h, d = q.shape
  scale = 1 / np.sqrt(d) if scale is None else scale
  valid = np.broadcast_to(allowed, (b, h, n, n))
  if key_padding is not None:
    valid = valid & np.asarray(key_padding)[:, None, None, :]
  s = np.einsum('bqhd,bkhd->bhqk', q, k) * scale
  s = np.where(valid, s, -np.inf)
  mx = s.max(-1, keepdims=True)
  e = np.where(valid, np.exp(s - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
  z = e.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhd->bqhd', e / np.where(z == 0, 1.0, z), v)


def max_intermediate(jaxpr) -> int:
  """Largest number of elements of any value in a (nested) jaxpr."""
  biggest = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      shape = getattr(var.aval, 'shape', ())
      biggest = max(biggest, int(np.prod(shape)) if shape else 1)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(sub, jax_core.ClosedJaxpr):
          biggest = max(biggest, max_intermediate(sub.jaxpr))
        elif isinstance(sub, jax_core.Jaxpr):
          biggest = max(biggest, max_intermediate(sub))
  return biggest


def largest_array(fn, n, h=1, d=8):
  """Largest intermediate (elements) of `fn(q, k, v)` and of its gradient, batch 1."""
  q, k, v = (jax.ShapeDtypeStruct((1, n, h, d), np.float32) for _ in range(3))
  loss = lambda q, k, v: (fn(q, k, v) ** 2).sum()
  fwd = max_intermediate(jax.make_jaxpr(fn)(q, k, v).jaxpr)
  bwd = max_intermediate(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr)
  return max(fwd, bwd)


def flax_mask(key_padding):
  """The flax-style `[b, 1, n, n]` mask of `make_attention_mask(pad, pad)`."""
  return key_padding[:, None, :, None] & key_padding[:, None, None, :]


def check_padding_and_bfloat16(fn, n, reference, **input_options):
  """Key padding is honoured, and bfloat16 is finite and accurate, in one compile.

  With bfloat16 inputs and key padding `padding(n)`:
    * outputs agree with the float64 reference to bfloat16 precision;
    * keys and values at padded positions (replaced by noise of size 1e3) move
      no output at a real query position, and get zero gradient;
    * outputs and gradients stay finite, also for q, k of norm ~30 sqrt(d).

  Args:
    fn: `fn(q, k, v, mask)`.
    n: sequence length.
    reference: float64 `reference(q, k, v, mask)`.
    **input_options: passed to `inputs`.
  """
  pad = padding(n)
  vg = value_and_grads(fn)  # gradients w.r.t. q, k, v; the mask rides along
  bf16 = lambda *x: tuple(jnp.asarray(a, jnp.bfloat16) for a in x)
  q, k, v = bf16(*inputs(n=n, **input_options))
  out, _ = vg(q, k, v, pad)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(out, np.float32), reference(q, k, v, pad), atol=5e-2, rtol=5e-2
  )
  k2, v2 = bf16(with_noise_at_padding(k, pad), with_noise_at_padding(v, pad, seed=2))
  out2, (_, gk, gv) = vg(q, k2, v2, pad)
  np.testing.assert_array_equal(np.asarray(out2, np.float32)[pad], np.asarray(out, np.float32)[pad])
  gk, gv = np.asarray(gk, np.float32), np.asarray(gv, np.float32)
  assert np.all(gk[~pad] == 0) and np.all(gv[~pad] == 0) and np.any(gk[pad] != 0)
  big = bf16(*inputs(n=n, scale=30.0, **input_options))
  for out, grads in (vg(q, k2, v2, pad), vg(*big, pad)):
    assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
    for g in grads:
      assert g.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))

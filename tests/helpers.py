"""Assertions and inputs shared by several test files."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from efficient_attn.models import sampling as sampling_lib


def assert_no_lookahead(fn, args, past_args=(1, 2)):
  """fn(*args) -> [1, l, 1, dv]; d out_t / d arg_s must vanish for s > t.

  One compiled VJP, pulled back from a random cotangent on output t alone, for
  every t. The last output must also depend on the first three positions of
  the args in `past_args` (keys, values, gates): the test is not vacuous.
  """
  out = jax.eval_shape(fn, *args)
  l = out.shape[1]
  vjp = jax.jit(lambda ct, *a: jax.vjp(fn, *a)[1](ct))
  cts = np.random.default_rng(0).normal(size=out.shape).astype(np.float32)
  for t in range(l):
    ct = np.zeros(out.shape, np.float32)
    ct[:, t] = cts[:, t]
    grads = vjp(jnp.asarray(ct, out.dtype), *args)
    for i, g in enumerate(grads):
      g = np.asarray(g)
      assert np.all(g[:, t + 1 :] == 0), f'output {t} depends on later inputs of arg {i}'
      if t == l - 1 and i in past_args:
        assert np.any(g[:, :3] != 0)


def value_and_grads(fn, num_args=3):
  """A jitted (*args) -> (fn(*args), d sum(fn) / d args)."""

  def loss(*a):
    out = fn(*a)
    return jnp.sum(out.astype(jnp.float32)), out

  vg = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(num_args)), has_aux=True))

  def run(*args):
    (_, out), grads = vg(*args)
    return out, grads

  return run


# Key padding `[2, 10]`: row 0 all real, row 1 with its last 4 tokens padded.
PAD = np.array([[True] * 10, [True] * 6 + [False] * 4])


def np_safe(den, eps):
  """NumPy `linear_attention.safe_denominator`: |den| >= eps, sign kept."""
  return np.where(den >= 0, np.maximum(den, eps), np.minimum(den, -eps))


def np_kernel_ref(phi_q, phi_k, v, key_padding=None, causal=False, *, eps, normalize=True):
  """out_i = sum_j A_ij v_j / sum_j A_ij with A = phi_q phi_k^T over the visible keys.

  The float64 quadratic form of kernel attention (linear, RFA, Performer);
  `normalize=False` leaves out the denominator.
  """
  a = np.einsum('bqhf,bkhf->bhqk', phi_q, phi_k)
  lq, lk = a.shape[-2:]
  visible = np.ones((1, 1, lq, lk), bool)
  if causal:
    visible = visible & np.tril(np.ones((lq, lk), bool))[None, None]
  if key_padding is not None:
    visible = visible & key_padding[:, None, None, :]
  a = np.where(visible, a, 0.0)
  out = np.einsum('bhqk,bkhd->bqhd', a, v)
  if normalize:
    out = out / np_safe(np.swapaxes(a.sum(-1), 1, 2), eps)[..., None]
  return out


def random_variables(layer, x):
  """Variables of `layer` for `x`, drawn with NumPy (no init to compile); the super
  scheme's W_A is then dense, not the identity, so it mixes every position."""
  shapes = jax.eval_shape(layer.init, jax.random.PRNGKey(0), x)
  rng = np.random.default_rng(1)
  return jax.tree.map(lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape), s.dtype), shapes)


def empty_cache(decoder, variables, x):
  """`{'cache': ...}`: the empty decoding cache that `decoder` (a layer with decode=True)
  makes on its first call with `x`. One compiled program that returns the cache alone, so
  XLA drops the unused attention (an eager call would run op by op)."""
  return jax.jit(lambda v, x: decoder.apply(v, x, mutable=['cache'])[1])(variables, x)


def assert_close_where(a, b, where, what):
  """a == b (to float32 round-off of their scale) at `where` [batch, length]; elsewhere
  either may hold anything, NaN included. A NaN at `where` fails."""
  where = np.asarray(where)[..., None]
  scale = max(1.0, float(np.where(where, np.abs(b), 0).max()))  # fnet's outputs reach ~100
  gap = np.where(where, np.abs(np.asarray(a) - np.asarray(b)), 0)
  assert gap.max() <= 1e-5 * scale, f'{what}: moved by {gap.max():.3g}'


def assert_decode_matches_parallel(model, params, inputs, atol=1e-3):
  """A `CausalTransformer`'s one-token-at-a-time logits equal its parallel forward.

  inputs `[b, n]` (already shifted right); checked at every position.
  """
  b, n = inputs.shape
  parallel = jax.jit(model.apply)({'params': params}, inputs)
  step = jax.jit(sampling_lib.make_step(model))
  cache = jax.jit(lambda p: sampling_lib.init_cache(model.clone(decode=True), p, b, n))(params)
  for t in range(n):
    logits, cache = step(params, cache, inputs[:, t])
    np.testing.assert_allclose(
      logits, parallel[:, t], atol=atol, rtol=atol, err_msg=f'position {t}'
    )


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(path: str, arg: str = None) -> ml_collections.ConfigDict:
  """Loads a config file as `--config=path[:arg]` does."""
  spec = importlib.util.spec_from_file_location('cfg', os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()

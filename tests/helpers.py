"""Assertions and inputs shared by several test files."""
import jax
import jax.numpy as jnp
import numpy as np


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
      assert np.all(g[:, t + 1:] == 0), f'output {t} depends on later inputs of arg {i}'
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

"""Initialisers of the gated recurrences' parameters, `(key, shape, dtype) -> array` as
Flax's: the references' defaults (PyTorch's modules, mamba_ssm, flash-linear-attention's
models, fla's GLA layer) that the mechanisms' declarations name."""

import math

import jax
import jax.numpy as jnp

F32 = jnp.float32
FLA_STD = 0.02  # fla's `initializer_range`
DT_MIN, DT_MAX = 1e-3, 0.1  # Mamba's dt range at initialisation


def conv_init(key, shape, dtype=F32):
  """PyTorch's depthwise Conv1d initialisation: U(-1/sqrt(kernel), 1/sqrt(kernel))."""
  bound = 1.0 / math.sqrt(shape[0])
  return jax.random.uniform(key, shape, F32, -bound, bound).astype(dtype)


def conv_bias_init(kernel_size: int):
  """PyTorch's Conv1d bias (mamba_ssm's): U(-1/sqrt(kernel), 1/sqrt(kernel)), any shape."""

  def init(key, shape, dtype=F32):
    bound = 1.0 / math.sqrt(kernel_size)
    return jax.random.uniform(key, shape, F32, -bound, bound).astype(dtype)

  return init


def fla_init(key, shape, dtype=F32):
  """flash-linear-attention's model initialisation of every linear layer and convolution
  (`_init_weights`): N(0, 0.02). Its biases start at zero."""
  return (FLA_STD * jax.random.normal(key, shape, F32)).astype(dtype)


def zeros_init(key, shape, dtype=F32):
  del key
  return jnp.zeros(shape, dtype)


def ones_init(key, shape, dtype=F32):
  del key
  return jnp.ones(shape, dtype)


def torch_linear_init(key, shape, dtype=F32):
  """PyTorch's nn.Linear default, which the papers' gate projections use: uniform with
  variance 1 / (3 fan_in), fan_in the first axis of `shape` `[features, ...]`."""
  return jax.nn.initializers.variance_scaling(
    1.0 / 3.0, 'fan_in', 'uniform', in_axis=0, out_axis=tuple(range(1, len(shape)))
  )(key, shape, dtype)


def gla_xavier_init(key, shape, dtype=F32):
  """Xavier uniform with gain 2^-2.5 over (first axis) -> (the rest), as fla's GLA layer
  until March 2025."""
  return jax.nn.initializers.variance_scaling(
    2.0**-5, 'fan_avg', 'uniform', in_axis=0, out_axis=tuple(range(1, len(shape)))
  )(key, shape, dtype)


def inverse_softplus(x):
  return x + jnp.log(-jnp.expm1(-x))


def dt_bias_init(key, shape, dtype=F32, dt_min: float = DT_MIN, dt_max: float = DT_MAX):
  """Mamba's dt bias: softplus(bias) = dt, dt log-uniform in [dt_min, dt_max] (Gu & Dao 2023),
  floored at 1e-4 (mamba_ssm's `dt_init_floor`)."""
  u = jax.random.uniform(key, shape, F32)
  dt = jnp.maximum(jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)), 1e-4)
  return inverse_softplus(dt).astype(dtype)


def a_log_init(low: float, high: float):
  """A_log = log A, A uniform in [low, high] per head (Mamba-2: [1, 16])."""

  def init(key, shape, dtype=F32):
    a = jax.random.uniform(key, shape, F32, low, high)
    return jnp.log(jnp.maximum(a, 1e-4)).astype(dtype)

  return init


# RWKV-7 (fla's RWKV7Attention._initialize_weights, with the first layer's ratios: this
# layer does not know its depth). i is a parameter's flat index, N its size; per-head
# parameters `[heads, head_dim]` read `linear` = i / (N - 1) - 1/2 and `zigzag`, a signed
# square of the position within the head in [-1, 1].


def by_index(fn):
  """The initialiser of fn(i, N) (i the flat index, N the size), any shape."""

  def init(key, shape, dtype=F32):
    del key
    size = math.prod(shape)
    return fn(jnp.arange(size, dtype=F32), size).reshape(shape).astype(dtype)

  return init


def _linear(i, size):
  return i / max(size - 1, 1) - 0.5


def _zigzag(i, head_dim: int):
  z = ((i % head_dim) - (head_dim - 1) / 2) / max((head_dim - 1) / 2, 0.5)
  return z * jnp.abs(z)


def rwkv7_decay_bias(head_dim: int):
  """w_0 = -6 + 6 i / (N - 1) + 0.5 + 2.5 zigzag."""
  return by_index(lambda i, n: -5.5 + 6.0 * i / max(n - 1, 1) + 2.5 * _zigzag(i, head_dim))


def rwkv7_a_bias(head_dim: int):
  """a_0 = -0.19 + 0.3 zigzag + 0.4 linear."""
  return by_index(lambda i, n: -0.19 + 0.3 * _zigzag(i, head_dim) + 0.4 * _linear(i, n))


def rwkv7_k_k(key, shape, dtype=F32):
  """k_k = 0.71 - 0.1 linear."""
  return by_index(lambda i, n: 0.71 - 0.1 * _linear(i, n))(key, shape, dtype)


def constant_init(value: float):
  return by_index(lambda i, n: jnp.full_like(i, value))


def token_shift_init(power: float):
  """A token shift's mu = 1 - (i / N)^power (r: 0.2, k and v: 0.7, decay and a: 0.9,
  gate: 0.2)."""
  return by_index(lambda i, n: 1.0 - (i / n) ** power)


def lora_up_init(key, shape, dtype=F32):
  """A LoRA's up projection `[rank, ...]`: orthogonal with gain 0.1 (times sqrt(out / rank)
  where the output is wider). Its down projection starts at 0."""
  rank, out = shape[0], math.prod(shape[1:])
  gain = 0.1 * math.sqrt(out / rank) if out > rank else 0.1
  w = jax.nn.initializers.orthogonal(gain)(key, (rank, out), F32)
  return w.reshape(shape).astype(dtype)

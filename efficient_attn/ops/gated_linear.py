"""Gated linear attention: the decay recurrence, its chunkwise form, and the shared layer.

The decay family (RetNet's retention, Sun et al. 2023; GLA, Yang et al. 2024;
Mamba-2's state space duality, Dao & Gu 2024) is one recurrence per head,

    S_t = diag(a_t) S_{t-1} + k_t v_t^T,      o_t = S_t^T q_t,

with a state S `[dk, dv]` and a decay a_t in (0, 1] that is one number per head
(retention, Mamba-2) or one per key feature (GLA). Three forms compute it:

  * `gated_scan`: the recurrence itself, one token at a time (the definition);
  * `gated_chunked`: chunkwise parallel (Yang et al. 2024, section 3): the
    sequence is cut into chunks of c tokens, the state is carried from chunk to
    chunk by `lax.scan`, and inside a chunk the causal part is a c x c matrix;
    O(n c dk + n dk dv) time per head instead of the scan's n sequential steps;
  * `gated_step`: one token of decoding, O(dk dv) whatever the position.

Decays are given as log-decays g_t = log a_t <= 0, in float32. Inside a chunk
every decay factor is exp of a difference of cumulative log-decays taken in the
direction that makes it <= 1 (from a key to a later query, or to the chunk
end), masked before exponentiation: nothing overflows however strong the
decay, and the chunk-local cumulative sums never reach the sequence length.

`GatedRecurrence` is the mechanism declaration these mechanisms, and the delta
rule's (`efficient_attn.ops.delta_rule`), share: causal only, key padding (a padded
token neither writes to the state nor decays it), the optional short causal
convolution on q, k and v with its decoding state, gates read from the layer
input (`registry.Mechanism.reads_input`), and the three forms. Each mechanism
file adds its gates and its output (norm and gate).

Shapes: q, k `[batch, length, heads, dk]`, v `[batch, length, heads, dv]`,
log-decays `[batch, length, heads, 1 or dk]`; outputs `[batch, length, heads,
dv]`; states `[batch, heads, dk, dv]`.
"""

import functools
import math
from typing import Any, Callable, NamedTuple, Optional, Tuple

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops import collectives
from efficient_attn.ops import kernels
from efficient_attn.ops import masking

F32 = jnp.float32
NORM_EPS = 1e-5  # the output RMSNorm's epsilon (fla's and Mamba-2's default)


def heads_first(x, dtype=F32):
  """`[b, n, h, ...]` -> `[b, h, n, ...]` in `dtype` (float32)."""
  return jnp.swapaxes(x.astype(dtype), 1, 2)


def matmul_dtype(*xs):
  """The chunk forms' matmul operand dtype for inputs xs (q, k, v): bfloat16 where all are
  bfloat16, else float32. Products accumulate in float32 either way (`mm`), and states,
  decays, cumulative sums and the delta rule's triangular inverse stay float32."""
  return jnp.bfloat16 if all(x.dtype == jnp.bfloat16 for x in xs) else F32


def mm(spec: str, a, b, dtype=F32):
  """einsum(spec, a, b) with both operands in `dtype`, accumulated in float32."""
  return jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=F32)


def chunked(xs, chunk_size: int):
  """Each `[b, h, n, ...]` array of `xs` (None passes) zero-padded to a multiple of c and cut
  into `[n_chunks, b, h, c, ...]`; returns (chunks, c)."""
  n = next(x for x in xs if x is not None).shape[2]
  c = max(1, min(int(chunk_size), n))
  nc = -(-n // c)

  def cut(x):
    if x is None:
      return None
    x = jnp.pad(x, [(0, 0), (0, 0), (0, nc * c - n)] + [(0, 0)] * (x.ndim - 3))
    x = x.reshape(x.shape[:2] + (nc, c) + x.shape[3:])
    return jnp.moveaxis(x, 2, 0)

  return tuple(cut(x) for x in xs), c


def unchunked(out, n: int):
  """`[n_chunks, b, h, c, dv]` -> `[b, n, h, dv]` (the first n tokens)."""
  nc, b, h, c, dv = out.shape
  out = jnp.moveaxis(out, 0, 2).reshape(b, h, nc * c, dv)[:, :, :n]
  return jnp.swapaxes(out, 1, 2)


def decay_within(cum, inclusive: bool = True):
  """exp(cum_t - cum_s) for s <= t (s < t if not inclusive), else 0: `[..., c, c]` from
  cumulative log-decays `[..., c]`; masked before exp, so every factor is <= 1."""
  c = cum.shape[-1]
  tri = jnp.tril(jnp.ones((c, c), bool), 0 if inclusive else -1)
  diff = cum[..., :, None] - cum[..., None, :]
  return jnp.where(tri, jnp.exp(jnp.where(tri, diff, 0.0)), 0.0)


def rows(x, f):
  """x `[..., t, d]` times f `[..., t, 1 or d]`: each row by its factor (f `[..., t, 1]`) or
  elementwise. A row factor is applied as an einsum, whose gradient with respect to f is a
  matrix product (XLA on CPU runs the multiply-and-sum that autodiff writes for a
  broadcast ~10x slower)."""
  if f.shape[-1] == x.shape[-1] != 1:
    return x * f
  return jnp.einsum('...td,...t->...td', x, f[..., 0])


def init_gated_state(batch: int, heads: int, dk: int, dv: int):
  """The empty state S `[batch, heads, dk, dv]` (float32)."""
  return jnp.zeros((batch, heads, dk, dv), F32)


def gated_step(s, q_t, k_t, v_t, g_t, beta_t=None):
  """One token: S = diag(exp(g_t)) S + k_t v_t^T, o_t = S^T q_t.

  s `[b, h, dk, dv]`; q_t, k_t `[b, h, dk]`; v_t `[b, h, dv]`; g_t `[b, h, 1 or dk]`
  (log-decay). Returns (S, o_t `[b, h, dv]`), float32.
  """
  del beta_t  # the decay family has no erase step
  q_t, k_t, v_t, g_t = (x.astype(F32) for x in (q_t, k_t, v_t, g_t))
  s = jnp.exp(g_t)[..., None] * s + k_t[..., :, None] * v_t[..., None, :]
  return s, jnp.einsum('bhk,bhkv->bhv', q_t, s)


def scan_tokens(step, q, k, v, g, beta=None, state=None):
  """The recurrence `step(S, q_t, k_t, v_t, g_t, beta_t)` over every token (`lax.scan`).

  q, k `[b, n, h, dk]`, v `[b, n, h, dv]`, g `[b, n, h, 1 or dk]`, beta `[b, n, h]` or None;
  state: the initial S (None: zeros). Returns (out `[b, n, h, dv]`, final S), float32.
  """
  b, _, h, dk = q.shape
  s0 = init_gated_state(b, h, dk, v.shape[-1]) if state is None else state
  xs = tuple(None if x is None else jnp.moveaxis(x.astype(F32), 1, 0) for x in (q, k, v, g, beta))
  s, out = lax.scan(lambda s, x: step(s, *x), s0, xs)
  return jnp.moveaxis(out, 0, 1), s


def gated_scan(q, k, v, g, beta=None, state=None, chunk_size=None):
  """The decay recurrence token by token (the definition); see `scan_tokens`."""
  del chunk_size
  return scan_tokens(gated_step, q, k, v, g, beta, state)


SUB_CHUNK = 16  # sub-chunk of a per-feature decay's intra-chunk scores


def per_feature_scores(q, k, cum, sub: int = SUB_CHUNK):
  """sum_d q_td k_sd exp(cum_td - cum_sd) for s <= t, else 0: `[..., c, c]` from q, k and
  cumulative log-decays `[..., c, dk]`, with every exp <= 1.

  Within a sub-chunk of `sub` tokens the factors are formed per feature (masked first);
  between sub-chunks j < i they split at the end e_j of sub-chunk j:
  exp(cum_t - cum_s) = exp(cum_t - cum_e) exp(cum_e - cum_s), both <= 1, so the block is
  one matrix product (Yang et al. 2024's secondary chunking). `sub` must divide c
  (else one sub-chunk of c).
  """
  c, dk = cum.shape[-2:]
  sub = sub if c % sub == 0 else c
  ns = c // sub
  dtype = matmul_dtype(q, k)  # the matmul's operands; the factors are formed in float32
  split = lambda x: x.reshape(x.shape[:-2] + (ns, sub, dk))
  qs, ks, cs = split(q.astype(F32)), split(k.astype(F32)), split(cum)  # [..., ns, sub, dk]
  tri = jnp.tril(jnp.ones((sub, sub), bool))[..., None]
  diff = cs[..., :, None, :] - cs[..., None, :, :]  # [..., ns, sub, sub, dk]
  w = jnp.where(tri, jnp.exp(jnp.where(tri, diff, 0.0)), 0.0)
  diag = jnp.einsum('...td,...sd,...tsd->...ts', qs, ks, w)  # [..., ns, sub, sub]
  if ns == 1:
    return diag[..., 0, :, :]
  end = cs[..., -1, :]  # [..., ns, dk]
  later = jnp.tril(jnp.ones((ns, ns), bool), -1)[:, :, None, None]  # [i, j]: j < i
  to_end = cs[..., :, None, :, :] - end[..., None, :, None, :]  # [..., i, j, sub, dk]
  q_ij = qs[..., :, None, :, :] * jnp.where(later, jnp.exp(jnp.where(later, to_end, 0.0)), 0.0)
  k_j = ks * jnp.exp(end[..., :, None, :] - cs)  # [..., j, sub, dk]
  off = mm('...ijtd,...jsd->...itjs', q_ij, k_j, dtype)  # [..., i, sub, j, sub]
  eye = jnp.eye(ns, dtype=diag.dtype)
  full = off + jnp.einsum('...its,ij->...itjs', diag, eye)
  return full.reshape(full.shape[:-4] + (c, c))


def gated_chunked(
  q, k, v, g, beta=None, state=None, chunk_size: int = 64, sub_chunk: int = SUB_CHUNK
):
  """The decay recurrence chunkwise in parallel; equals `gated_scan`.

  Inside a chunk with cumulative log-decays b_t (from the chunk start):
    o_t = (q_t * exp(b_t))^T S_0 + sum_{s<=t} (q_t * exp(b_t - b_s)) . k_s v_s,
    S_c = diag(exp(b_c)) S_0 + sum_s (k_s * exp(b_c - b_s)) v_s^T.
  A per-feature decay (GLA) gets its c x c scores from `per_feature_scores` (sub-chunks
  of `sub_chunk` tokens), every factor <= 1. Where q, k, v are all bfloat16 the matmuls
  take bfloat16 operands (`matmul_dtype`), accumulated in float32; the state, decays and
  cumulative sums are float32 whatever the inputs.

  Args: as `scan_tokens`, and chunk_size c (any length works; the last chunk is padded
  with tokens that neither write nor decay). Returns (out `[b, n, h, dv]`, final S).
  """
  del beta
  b, n, h, dk = q.shape
  dv = v.shape[-1]
  dtype = matmul_dtype(q, k, v)
  (qc, kc, vc, gc), c = chunked(
    tuple(heads_first(x, t) for x, t in ((q, dtype), (k, dtype), (v, dtype), (g, F32))), chunk_size
  )
  s0 = init_gated_state(b, h, dk, dv) if state is None else state
  scalar = g.shape[-1] == 1

  def body(s, x):
    qx, kx, vx, gx = x  # [b, h, c, dk|dv|dg]
    cum = jnp.cumsum(gx, axis=2)  # [b, h, c, dg]
    if scalar:
      a = mm('bhqd,bhkd->bhqk', qx, kx, dtype) * decay_within(cum[..., 0])
    else:
      a = per_feature_scores(qx, kx, cum, sub_chunk)
    out = mm('bhqk,bhkv->bhqv', a, vx, dtype)
    out = out + mm('bhqd,bhdv->bhqv', rows(qx.astype(F32), jnp.exp(cum)), s, dtype)
    last = cum[:, :, -1:]  # [b, h, 1, dg]
    s = rows(s, jnp.swapaxes(jnp.exp(last), 2, 3)) + mm(
      'bhkd,bhkv->bhdv', rows(kx.astype(F32), jnp.exp(last - cum)), vx, dtype
    )
    return s, out

  s, out = lax.scan(jax.checkpoint(body, prevent_cse=False), s0, (qc, kc, vc, gc))
  return unchunked(out, n), s


class Cores(NamedTuple):
  """A recurrence's three forms, one signature: `scan` and `chunked` take (q, k, v, g, beta,
  state, chunk_size) -> (out, S); `step` takes (S, q_t, k_t, v_t, g_t, beta_t) -> (S, o_t);
  `init(batch, heads, dk, dv)` is the empty state; `pallas`, the chunk form's Pallas
  kernels (`efficient_attn.ops.kernels`), `chunked`'s signature."""

  scan: Callable[..., Any]
  chunked: Callable[..., Any]
  step: Callable[..., Any]
  init: Callable[..., Any]
  pallas: Optional[Callable[..., Any]] = None


DECAY = Cores(gated_scan, gated_chunked, gated_step, init_gated_state, kernels.decay_chunked)


# The pure functions (`retention_attention`, `gla_attention`, `mamba2_attention`,
# `delta_rule_attention`): the recurrence alone on q, k, v as it reads them, without the
# parameters of the layer around it (short convolution, gate projections, output norm).


def pure_inputs(mechanism: str, function: str, q, k, v, mask, gates, *, form: str, chunk_size: int):
  """The key padding `[b, n]` (or None) of a pure function's call, after its checks: q, k,
  v `[b, n, h, d]` (`masking.check_inputs`), `gates` ({name: (array, allowed shapes)})
  and the options `form` and `chunk_size` (`mechanism`'s Options); one-line ValueErrors
  naming `function`."""
  masking.check_inputs(q, k, v, mask, name=function, same_length=True)
  registry.check_arguments(mechanism, function, form=form, chunk_size=chunk_size)
  for name, (x, shapes) in gates.items():
    if x is not None and tuple(x.shape) not in shapes:
      raise ValueError(
        f'{function}: {name} of shape {tuple(x.shape)} does not fit q '
        f'{tuple(q.shape)}; valid: {" or ".join(map(str, map(list, shapes)))}'
      )
  return masking.key_padding_from_mask(mask, k.shape[0], k.shape[1])


def pure_recurrence(
  cores: Cores,
  q,
  k,
  v,
  g=None,
  beta=None,
  key_padding=None,
  *,
  form: str = 'chunk',
  chunk_size: int = 64,
):
  """out `[b, n, h, dv]` (float32) of the recurrence `cores` ('chunk': chunkwise; 'naive':
  token by token, the definition) on its inputs (shapes as `scan_tokens`). A padded token
  (`key_padding` `[b, n]` False) neither writes to the state nor decays it; its output is 0."""
  if key_padding is not None:
    q, k, v = (masking.zero_padded(x, key_padding) for x in (q, k, v))
    g, beta = (None if x is None else masking.zero_padded(x, key_padding) for x in (g, beta))
  core = cores.chunked if form == 'chunk' else cores.scan
  return core(q, k, v, g, beta, chunk_size=chunk_size)[0]


# The short causal convolution (fla's ShortConvolution; Mamba-2's conv1d).


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


FLA_STD = 0.02  # fla's `initializer_range`


def fla_init(key, shape, dtype=F32):
  """flash-linear-attention's model initialisation of every linear layer and convolution
  (`_init_weights`): N(0, 0.02). Its biases start at zero."""
  return (FLA_STD * jax.random.normal(key, shape, F32)).astype(dtype)


def zeros_init(key, shape, dtype=F32):
  del key
  return jnp.zeros(shape, dtype)


def causal_conv(x, w, bias=None):
  """Depthwise causal convolution along the sequence: out_t = sum_i w[i] x_{t - K + 1 + i}
  (+ bias).

  x `[b, n, h, d]`, w `[K, h, d]`, bias `[h, d]` or None -> `[b, n, h, d]` (float32).
  """
  out = _causal_conv(x.astype(F32), w.astype(F32))
  return out if bias is None else out + bias.astype(F32)


def _shifted_sum(x, w, reverse: bool = False):
  """sum_i w[i] x_{t - K + 1 + i} (reverse: sum_i w[i] x_{t + K - 1 - i}), zero outside."""
  size, n = w.shape[0], x.shape[1]
  pad = (0, size - 1) if reverse else (size - 1, 0)
  xp = jnp.pad(x, [(0, 0), pad, (0, 0), (0, 0)])
  at = lambda i: size - 1 - i if reverse else i
  return sum(w[i] * xp[:, at(i) : at(i) + n] for i in range(size))


@jax.custom_vjp
def _causal_conv(x, w):
  return _shifted_sum(x, w)


def _causal_conv_fwd(x, w):
  return _shifted_sum(x, w), (x, w)


def _causal_conv_bwd(res, d_out):
  # The kernel's gradient as one matrix product per tap: XLA on CPU runs the
  # multiply-and-sum over [b, n] that autodiff writes about 8x slower.
  x, w = res
  size, (b, n, h, d) = w.shape[0], x.shape
  xp = jnp.pad(x, [(0, 0), (size - 1, 0), (0, 0), (0, 0)])
  ones = jnp.ones((1, b * n), F32)
  d_w = jnp.concatenate(
    [ones @ (d_out * xp[:, i : i + n]).reshape(b * n, h * d) for i in range(size)]
  ).reshape(w.shape)
  return _shifted_sum(d_out, w, reverse=True), d_w


_causal_conv.defvjp(_causal_conv_fwd, _causal_conv_bwd)


def conv_step(history, x_t, w, bias=None):
  """One token of `causal_conv`: history `[b, K - 1, h, d]` (the previous inputs), x_t
  `[b, 1, h, d]` -> (new history, out_t `[b, 1, h, d]`)."""
  window = jnp.concatenate([history, x_t.astype(F32)], axis=1)
  out = jnp.sum(window * w.astype(F32), axis=1, keepdims=True)
  return window[:, 1:], out if bias is None else out + bias.astype(F32)


def rms_norm(x, scale=None, axes=(-1,), eps: float = NORM_EPS):
  """x / sqrt(mean(x^2 over axes) + eps) (* scale): the output norm (float32)."""
  x = x.astype(F32)
  inv = lax.rsqrt(jnp.mean(jnp.square(x), axis=axes, keepdims=True) + eps)
  if axes in ((-1,), -1):
    x = rows(x, inv)
  else:
    x = x * inv
  return x if scale is None else x * scale.astype(F32)


def dense(x, kernel, bias=None):
  """x `[b, n, features]` times kernel `[features, ...]` (+ bias), in float32."""
  y = jnp.tensordot(x.astype(F32), kernel.astype(F32), axes=1)
  return y if bias is None else y + bias.astype(F32)


def inverse_softplus(x):
  return x + jnp.log(-jnp.expm1(-x))


DT_MIN, DT_MAX = 1e-3, 0.1  # Mamba's dt range at initialisation


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


def torch_linear_init(key, shape, dtype=F32):
  """PyTorch's nn.Linear default, which the papers' gate projections use: uniform with
  variance 1 / (3 fan_in), fan_in the first axis of `shape` `[features, ...]`."""
  return jax.nn.initializers.variance_scaling(
    1.0 / 3.0, 'fan_in', 'uniform', in_axis=0, out_axis=tuple(range(1, len(shape)))
  )(key, shape, dtype)


def ones_init(key, shape, dtype=F32):
  del key
  return jnp.ones(shape, dtype)


INITS = ('default', 'fla')


def common_options(
  conv_size: int, conv_bias: bool = False, default_init: str = "PyTorch's module defaults"
) -> Tuple[registry.Option, ...]:
  """The options every gated recurrence has (`conv_size`, `conv_bias`: the reference's
  defaults; `default_init`: what init='default' is, for the option's doc)."""
  return (
    registry.Option('chunk_size', 64, int, 'chunk length of the chunkwise form', minimum=1),
    registry.Option(
      'form',
      'chunk',
      str,
      "chunk: chunkwise parallel (training); naive: the token-by-token recurrence (the definition)",
      choices=('chunk', 'naive'),
    ),
    registry.Option(
      'conv_size',
      conv_size,
      int,
      'kernel of the short causal convolution on q, k and v (0: none)',
      minimum=0,
    ),
    registry.Option('conv_bias', conv_bias, bool, 'a bias in the short convolution'),
    registry.Option(
      'init',
      'default',
      str,
      f'initialisation of the convolution and the '
      f'gate projections: default ({default_init}) or fla (N(0, 0.02), '
      f"flash-linear-attention's model initialisation)",
      choices=INITS,
    ),
    registry.Option(
      'implementation',
      'auto',
      str,
      "the chunk form's code: xla, or pallas "
      '(the Pallas kernels of efficient_attn.ops.kernels; interpreted on CPU); '
      'auto: xla until a measurement shows a kernel faster',
      choices=kernels.IMPLEMENTATIONS,
    ),
  )


def decay_options() -> Tuple[registry.Option, ...]:
  """Mamba's dt range at initialisation (Mamba-2, Gated DeltaNet): the decay starts at
  a = exp(-A dt), dt log-uniform in [dt_min, dt_max]."""
  return (
    registry.Option(
      'dt_min', DT_MIN, float, 'smallest dt at initialisation (Mamba: 0.001)', above=0.0
    ),
    registry.Option(
      'dt_max', DT_MAX, float, 'largest dt at initialisation (Mamba: 0.1)', above=0.0
    ),
  )


def dt_init(options):
  """The dt bias initialiser of `options` (with `decay_options`)."""
  return functools.partial(dt_bias_init, dt_min=options.dt_min, dt_max=options.dt_max)


def check_dt_range(name: str, options) -> None:
  if options.dt_min > options.dt_max:
    raise ValueError(
      f'mechanism {name!r}: dt_min={options.dt_min} exceeds dt_max={options.dt_max}; '
      f'the initial dt range needs dt_min <= dt_max'
    )


# Context parallelism (`efficient_attn.layers.parallel`): the recurrence on one device's block.


def decayed_sharded(core, q, k, v, g, beta=None, *, chunk_size: int, axis: str):
  """The decay recurrence on this device's block of a sequence split over mesh axis `axis`
  (inside `jax.shard_map`): `core` (a `Cores` chunked or scan form) from the zero state
  gives the block's output and final state S; each block's (total decay A, S) is combined
  over the devices before it, (A1, S1) then (A2, S2) = (A1 A2, diag(A2) S1 + S2)
  (`collectives.exclusive_scan`), and the incoming state S_in adds
  (q_t * exp(b_t))^T S_in to each token's output (b_t: the cumulative log-decay from the
  block's start), a linear correction in place of a second pass.

  Shapes as `gated_scan` (this block's); returns out `[b, m, h, dv]` (float32).
  """
  out, s = core(q, k, v, g, beta, chunk_size=chunk_size)
  g = g.astype(F32)
  decay = jnp.exp(jnp.sum(g, axis=1))  # [b, h, 1 or dk]

  def combine(earlier, later):
    (a1, s1), (a2, s2) = earlier, later
    return a1 * a2, a2[..., None] * s1 + s2

  identity = (jnp.ones_like(decay), jnp.zeros_like(s))
  _, s_in = collectives.exclusive_scan(combine, (decay, s), identity, axis)
  q_decayed = rows(q.astype(F32), jnp.exp(jnp.cumsum(g, axis=1)))
  return out + jnp.einsum('bnhk,bhkv->bnhv', q_decayed, s_in)


class RecurrentState(NamedTuple):
  """A gated recurrence's decoding state: S `[batch, heads, dk, dv]` and the short
  convolution's last K - 1 inputs (q, k, v), each `[batch, K - 1, heads, d]` (q and k
  `[batch, K - 1, qk_heads, dk]` where heads share query/key groups; empty without
  it). Constant size."""

  s: jnp.ndarray
  conv: Tuple[jnp.ndarray, ...]


class GatedRecurrence(registry.Mechanism):
  """The declaration the gated linear attentions share (not registered itself).

  A subclass sets `cores` (`DECAY` or `delta_rule.DELTA`), `activation` ('silu': applied to
  q, k, v after the short convolution) and implements:
    recurrence_inputs(options, params, q, k, v, gates) -> (q, k, v, log_decay, beta): the
      recurrence's inputs from the convolved q, k, v `[b, n, h, d]` and the gates
      (log_decay `[b, n, h, 1 or dk]`, None for no decay; beta `[b, n, h]` or None);
    finish(options, params, out, v, gates) -> the output `[b, n, h, dv]` from the
      recurrence's (norm, output gate);
    own_params(options, heads, head_dim), and `input_params` / `gates` as the registry says.
  A subclass may declare other head shapes (`head_shapes`; `qk_heads` for query/key
  groups shared by several heads): the short convolution then runs on q and k as
  projected (`[K, qk_heads, qk_dim]` kernels), and q and k are repeated to the value
  heads after it, before the recurrence.
  """

  causal = True
  causal_only = True
  reads_input = True
  masks = 'key_padding'
  decode = 'recurrent'
  cores: Cores = DECAY
  activation: str = ''  # '' or 'silu'
  sequence_parallel = 'decayed_state'
  # (core, q, k, v, g, beta, *, chunk_size, axis) -> out: the recurrence on one device's
  # block (`attend_sharded`), `decayed_sharded` or `delta_rule.transition_sharded`.
  sharded_recurrence = staticmethod(decayed_sharded)

  def own_params(self, options, *, heads, head_dim):
    del options, heads, head_dim
    return {}

  def qk_heads(self, options, heads: int) -> int:
    """Query/key heads for `heads` heads (default: one each; a divisor: shared groups)."""
    del options
    return heads

  @staticmethod
  def init_for(options, default):
    """The initialiser of a convolution or gate projection: `default` or, with init='fla',
    `fla_init`."""
    return fla_init if options.init == 'fla' else default

  def params(self, options, *, heads, head_dim, max_length, causal):
    qk_heads, qk_dim, v_dim = self.head_shapes(options, heads=heads, head_dim=head_dim)
    shapes = {'q': (qk_heads, qk_dim), 'k': (qk_heads, qk_dim), 'v': (heads, v_dim)}
    specs = {}
    for name in ('q', 'k', 'v') if options.conv_size else ():
      specs[f'{name}_conv'] = registry.ParamSpec(
        (options.conv_size,) + shapes[name], self.init_for(options, conv_init)
      )
      if options.conv_bias:
        bias_init = zeros_init if options.init == 'fla' else conv_bias_init(options.conv_size)
        specs[f'{name}_conv_bias'] = registry.ParamSpec(shapes[name], bias_init)
    specs.update(self.own_params(options, heads=heads, head_dim=head_dim))
    return specs

  def recurrence_inputs(self, options, params, q, k, v, gates):
    raise NotImplementedError

  def finish(self, options, params, out, v, gates):
    raise NotImplementedError

  def _features(self, options, params, q, k, v, axis=None):
    """The short convolution (with the sequence split over `axis`, each block reads the
    previous device's last conv_size - 1 tokens: `collectives.halo_before`), then the
    activation; float32."""
    if options.conv_size:
      halo = options.conv_size - 1

      def conv(x, n):
        w, b = params[f'{n}_conv'], params.get(f'{n}_conv_bias')
        if axis is None:
          return causal_conv(x, w, b)
        return causal_conv(jnp.concatenate([collectives.halo_before(x, halo, axis), x], 1), w, b)[
          :, halo:
        ]

      q, k, v = (conv(x, n) for x, n in zip((q, k, v), 'qkv'))
    return self._activate(q, k, v)

  def _activate(self, *xs):
    xs = tuple(x.astype(F32) for x in xs)
    return tuple(jax.nn.silu(x) for x in xs) if self.activation == 'silu' else xs

  @staticmethod
  def _to_heads(q, k, heads: int):
    """q, k `[b, n, qk_heads, dk]` repeated to `heads` (head i reads group i // (heads /
    qk_heads), as Mamba-2's ngroups)."""
    return tuple(jnp.repeat(x, heads // x.shape[2], axis=2) for x in (q, k))

  def _inputs(self, options, params, q, k, v, *, mask, causal, ctx, axis=None):
    """(q, k, v, log-decay, beta) of the recurrence from the projected heads: key padding
    checked, the short convolution and activation (`_features`), groups repeated to the
    heads, the mechanism's gates (`recurrence_inputs`); a padded token neither writes to the
    state nor decays it. In a bfloat16 layer q, k and v go back to bfloat16, so the chunk
    form's matrix products run in bfloat16 with float32 accumulation and state."""
    if not causal:
      raise ValueError(f'mechanism {self.name!r} is causal only: call it with causal=True')
    dtype = v.dtype
    k, v, kp = masking.checked_keys_values(
      q,
      k,
      v,
      mask,
      name=f'mechanism {self.name!r}',
      causal=True,
      qk_groups=self.qk_heads(options, v.shape[2]) != v.shape[2],
    )
    q = masking.zero_padded(q, kp)  # a padded token feeds no convolution either
    q, k, v = self._features(options, params, q, k, v, axis)
    q, k = self._to_heads(q, k, v.shape[2])
    q, k, v, g, beta = self.recurrence_inputs(options, params, q, k, v, ctx.gates)
    if kp is not None:
      k, v = masking.zero_padded(k, kp), masking.zero_padded(v, kp)
      g, beta = (None if x is None else masking.zero_padded(x, kp) for x in (g, beta))
    if jnp.dtype(dtype) == jnp.bfloat16:
      q, k, v = (x.astype(dtype) for x in (q, k, v))
    return q, k, v, g, beta

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    dtype = v.dtype
    q, k, v, g, beta = self._inputs(options, params, q, k, v, mask=mask, causal=causal, ctx=ctx)
    out, _ = self.core(options, q.dtype)(q, k, v, g, beta, chunk_size=options.chunk_size)
    return self.finish(options, params, out, v, ctx.gates).astype(dtype)

  def core(self, options, dtype):
    """The recurrence's form for a call with q, k, v of `dtype`: the Pallas kernels where
    `options.implementation` resolves to 'pallas' (`kernels.choose`, once per call), else the
    chunk form or, with form='naive', the token recurrence."""
    if kernels.choose(options.implementation, form=options.form, dtype=dtype) == 'pallas':
      return self.cores.pallas
    return self.cores.chunked if options.form == 'chunk' else self.cores.scan

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    """`attend` on one device's block (`efficient_attn.layers.parallel`): the short convolution
    reads the previous device's last conv_size - 1 tokens, and `sharded_recurrence` brings
    in the state of the blocks before; the core is attend's (the Pallas kernels where
    `implementation` resolves to 'pallas')."""
    dtype = v.dtype
    q, k, v, g, beta = self._inputs(
      options, params, q, k, v, mask=mask, causal=causal, ctx=ctx, axis=axis
    )
    out = self.sharded_recurrence(
      self.core(options, q.dtype), q, k, v, g, beta, chunk_size=options.chunk_size, axis=axis
    )
    return self.finish(options, params, out, v, ctx.gates).astype(dtype)

  def init_state(self, options, *, batch, heads, head_dim, v_dim):
    qk_heads = self.qk_heads(options, heads)
    conv = (
      tuple(
        jnp.zeros((batch, options.conv_size - 1, h, d), F32)
        for h, d in ((qk_heads, head_dim), (qk_heads, head_dim), (heads, v_dim))
      )
      if options.conv_size
      else ()
    )
    return RecurrentState(self.cores.init(batch, heads, head_dim, v_dim), conv)

  def step(self, options, params, state, q_t, k_t, v_t, *, ctx):
    dtype = v_t.dtype
    conv = state.conv
    if options.conv_size:
      steps = [
        conv_step(hist, x, params[f'{n}_conv'], params.get(f'{n}_conv_bias'))
        for hist, x, n in zip(state.conv, (q_t, k_t, v_t), 'qkv')
      ]
      conv = tuple(h for h, _ in steps)
      q_t, k_t, v_t = (y for _, y in steps)
    q_t, k_t, v_t = self._activate(q_t, k_t, v_t)
    q_t, k_t = self._to_heads(q_t, k_t, v_t.shape[2])
    q_t, k_t, v_t, g, beta = self.recurrence_inputs(options, params, q_t, k_t, v_t, ctx.gates)
    s, out = self.cores.step(
      state.s, q_t[:, 0], k_t[:, 0], v_t[:, 0], *(None if x is None else x[:, 0] for x in (g, beta))
    )
    out = self.finish(options, params, out[:, None], v_t, ctx.gates).astype(dtype)
    return RecurrentState(s, conv), out

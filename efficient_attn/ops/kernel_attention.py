"""Kernel attention: the core shared by linear attention, RFA and Performer.

With query and key features phi_q, phi_k (any feature map),

  out_i = phi_q_i^T S / (phi_q_i . Z),   S = sum_j phi_k_j v_j^T,  Z = sum_j phi_k_j

computed right-to-left in O(n f dv) instead of O(n^2) (Katharopoulos et al. 2020,
"Transformers are RNNs"). The causal form uses the prefix sums S_i, Z_i (j <= i),
which are also the hidden state of an RNN: `kernel_attention_step` decodes one
token in O(f dv), independent of position.

Shapes: phi_q `[batch, q_length, heads, f]`, phi_k `[batch, kv_length, heads, f]`,
v `[batch, kv_length, heads, dv]` -> `[batch, q_length, heads, dv]`.

Denominator: `safe_denominator` clamps |den| >= eps keeping its sign
(max(den, eps) for non-negative features). Unlike den + eps this leaves the
output exactly invariant to a common rescaling of the key features whenever
|den| >= eps (so Performer's key stabiliser cancels exactly, in parallel and
recurrent forms alike), and it never divides by ~0 for the sign-indefinite
trigonometric (RFA) features, whose estimated denominator may be <= 0: the
output is bounded by |numerator| / eps and keeps the numerator's sign.
"""

from typing import NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.ops import collectives
from efficient_attn.ops import masking


class KernelState(NamedTuple):
  """Recurrent state of causal kernel attention for one layer (a pytree).

  Attributes:
    s: S = sum_j phi(k_j) v_j^T, `[batch, heads, f, dv]`.
    z: Z = sum_j phi(k_j), `[batch, heads, f]`.
    log_scale: `[batch, heads]`; only Performer's positive features use it: the
      running key stabiliser (s and z hold the sums of features scaled by
      exp(-log_scale)). Starts at a large negative number (no key seen yet);
      the other feature maps carry it through untouched.
  """

  s: jnp.ndarray
  z: jnp.ndarray
  log_scale: jnp.ndarray


def init_kernel_state(
  batch: int, heads: int, feat_dim: int, v_dim: int, dtype=jnp.float32
) -> KernelState:
  """The empty state (no keys seen) for `kernel_attention_step`.

  Args:
    batch, heads: as in the attention inputs.
    feat_dim: f, the feature dimension of phi (the query/key width d for 'elu' /
      'relu' / 'identity', 1 + d + d^2 for 'taylor', 2 * num_features for RFA,
      num_features for Performer; `Mechanism.feature_dim`).
    v_dim: dv, the value head dimension.
    dtype: accumulation dtype; keep float32 (or wider) even for bf16 models.

  Memory O(batch * heads * f * dv), independent of the sequence length.
  """
  return KernelState(
    s=jnp.zeros((batch, heads, feat_dim, v_dim), dtype),
    z=jnp.zeros((batch, heads, feat_dim), dtype),
    log_scale=jnp.full((batch, heads), masking.big_neg(dtype), dtype),
  )


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


def _compute_dtype(*xs) -> jnp.dtype:
  return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


CAUSAL_CHUNK = {'cpu': 64, 'gpu': 256, 'tpu': 256}


def causal_chunk_size(chunk_size: Optional[int] = None) -> int:
  """`chunk_size`, or if None the platform's: 64 on CPU, 256 on GPU and TPU.

  Measured forward + backward at 1K-16K tokens: on one CPU core 64 beat 32,
  128 and 256 (256 costs 1.8x); on an H100 (bfloat16) 256 beat 16-128 (64
  costs 1.7x). The TPU value follows the GPU's and is not measured.
  """
  if chunk_size is not None:
    return chunk_size
  return CAUSAL_CHUNK.get(jax.default_backend(), 64)


def _log_gate(gate: jnp.ndarray, dtype) -> jnp.ndarray:
  gate = gate.astype(dtype)
  return jnp.log(jnp.clip(gate, jnp.finfo(dtype).tiny, 1.0))


def kernel_attention(
  phi_q: jnp.ndarray,
  phi_k: jnp.ndarray,
  v: jnp.ndarray,
  key_padding: Optional[jnp.ndarray] = None,
  causal: bool = False,
  eps: float = 1e-6,
  normalize: bool = True,
  chunk_size: Optional[int] = None,
  gate: Optional[jnp.ndarray] = None,
  return_state: bool = False,
  num_q: Optional[jnp.ndarray] = None,
  num_k: Optional[jnp.ndarray] = None,
  sequence_axis: Optional[str] = None,
):
  """The shared core: out_i = phi_q_i^T S / safe(phi_q_i . Z) over the visible keys.

  Non-causal: S, Z are summed over all keys once: time O(n f dv), memory
  O(n (f + dv) + f dv) per head.

  Causal (query i sees keys j <= i; needs q_length == kv_length): the sequence is
  cut into chunks of `chunk_size` c and `lax.scan`ned, carrying (S, Z). Inside a
  chunk the causal part is a masked c x c quadratic term, the past arrives
  through the carried state. Time O(n (c + f) dv + n c f) per head; memory
  O(n (f + dv) + c^2 + f dv): no O(n f dv) cumulative-sum tensor is formed.
  The chunk body is rematerialised (`jax.checkpoint`), so the backward pass
  stores only the inputs and one (S, Z) per chunk, O(n (f + dv) + (n / c) f dv),
  i.e. O(n d) for c ~ f. Any chunk size works; the last chunk is zero-padded.

  Gated (causal only; RFA's recency gate): with g_t in (0, 1) per token and head,
  S_t = g_t S_{t-1} + (1 - g_t) phi_k_t v_t^T and Z_t likewise. Inside a chunk
  the decays prod g are exp of differences of cumulative log-gates, masked
  before exponentiation, so they never overflow.

  Args:
    phi_q: `[batch, q_length, heads, f]` query features.
    phi_k: `[batch, kv_length, heads, f]` key features.
    v: `[batch, kv_length, heads, dv]`.
    key_padding: optional bool `[batch, kv_length]`, True = real key. Padded keys
      contribute nothing (their phi_k and v are zeroed; with a gate they also
      do not decay the state).
    causal: prefix (autoregressive) attention.
    eps: denominator clamp, see `safe_denominator`.
    normalize: divide by phi_q . Z (False: plain phi_q^T S, no denominator).
    chunk_size: causal chunk length c (None: `causal_chunk_size()`, per platform).
    gate: optional `[batch, kv_length, heads]` in (0, 1); causal only.
    return_state: also return the `KernelState` after the last key (prefill for
      recurrent decoding; its log_scale is left at "empty").
    num_q, num_k: optional numerator features, shaped like phi_q, phi_k: the
      numerator is num_q^T sum_j num_k_j v_j^T while the denominator stays
      phi_q . sum_j phi_k_j (RoFormer's rotary linear attention, Su et al. 2021:
      rotated features above, unrotated below). Default: phi_q, phi_k.
    sequence_axis: the inputs are this device's block of a sequence split over the
      mesh axis of that name, inside `jax.shard_map` (context parallelism,
      `efficient_attn.layers.parallel`): non-causal, S and Z are summed over the devices
      (`lax.psum`); causal, each device's block summary (S, Z, and the gate's total
      decay) is combined over the devices before it (`collectives.exclusive_scan`) and
      starts its chunked scan. Self-attention only; return_state gives the block's
      final state (the whole prefix's, causal).

  Returns:
    `[batch, q_length, heads, dv]` in v's dtype (computed in float32 or wider),
    and the final `KernelState` (float32 or wider) if `return_state`.
  """
  out_dtype = v.dtype
  split = num_q is not None or num_k is not None
  num_q = phi_q if num_q is None else num_q
  num_k = phi_k if num_k is None else num_k
  compute = _compute_dtype(phi_q, phi_k, v, num_q, num_k)
  phi_q, phi_k, v, num_q, num_k = (x.astype(compute) for x in (phi_q, phi_k, v, num_q, num_k))
  b, lq, h, f = phi_q.shape
  lk = phi_k.shape[1]
  if (
    phi_k.shape != (b, lk, h, f)
    or v.shape[:3] != (b, lk, h)
    or num_q.shape != phi_q.shape
    or num_k.shape != phi_k.shape
  ):
    raise ValueError(
      f'inconsistent shapes phi_q {phi_q.shape}, phi_k {phi_k.shape}, '
      f'v {v.shape}, num_q {num_q.shape}, num_k {num_k.shape}'
    )
  log_g = None
  if gate is not None:
    if not causal:
      raise ValueError('a recency gate needs causal=True')
    log_g = _log_gate(gate, compute)
    phi_k = phi_k * (1.0 - gate.astype(compute))[..., None]
    num_k = num_k * (1.0 - gate.astype(compute))[..., None]
  if key_padding is not None:
    key_padding = jnp.asarray(key_padding, bool)
    phi_k = masking.zero_padded(phi_k, key_padding)
    num_k = masking.zero_padded(num_k, key_padding)
    v = masking.zero_padded(v, key_padding)
    if log_g is not None:
      log_g = masking.zero_padded(log_g, key_padding)

  if not causal:
    s = jnp.einsum('bkhf,bkhd->bhfd', num_k, v)
    z = jnp.sum(phi_k, axis=1)
    if sequence_axis is not None:
      s, z = lax.psum((s, z), sequence_axis)
    out = jnp.einsum('bqhf,bhfd->bqhd', num_q, s)
    if normalize:
      out = normalize_by(out, jnp.einsum('bqhf,bhf->bqh', phi_q, z), eps)
  else:
    if lq != lk:
      raise ValueError(
        f'causal kernel attention needs q_length == kv_length, got '
        f'{lq} and {lk}; decode with kernel_attention_step'
      )
    state = (
      None if sequence_axis is None else _incoming_state(phi_k, num_k, v, log_g, sequence_axis)
    )
    out, (s, z) = _causal_chunked(
      phi_q, phi_k, v, log_g, eps, normalize, chunk_size, (num_q, num_k) if split else None, state
    )
  out = out.astype(out_dtype)
  if return_state:
    state = KernelState(s, z, jnp.full((b, h), masking.big_neg(compute), compute))
    return out, state
  return out


# Whether a kernel mechanism that opts in runs its [batch * heads] rows one at a time
# (`heads_as_batch(..., loop_rows=True)`), per platform.
LOOP_ROWS = {'cpu': True, 'gpu': False, 'tpu': False}


def loop_rows_here() -> bool:
  """`LOOP_ROWS` of the default backend: True on CPU."""
  return LOOP_ROWS.get(jax.default_backend(), False)


def heads_as_batch(
  fn, q, k, v, key_padding, return_state: bool = False, loop_rows: bool = False, **kwargs
):
  """Runs a kernel mechanism `fn` with each head as its own batch row.

  `fn(q, k, v, mask=key_padding, return_state=..., **kwargs)` sees q `[batch *
  heads, q_length, 1, d]` (k, v, key padding likewise): its feature tensors
  `[batch * heads, length, 1, f]` then feed XLA's batched matmuls with no
  transposes, which on CPU made Performer's forward + backward 1.6x faster
  (8192 tokens, 256 features). Only q, k, v and the output (d-sized) are
  transposed. The result is unfolded to `[batch, q_length, heads, dv]`, and a
  returned `KernelState` to `[batch, heads, ...]`.

  With `loop_rows`, `fn` sees one row at a time (q `[1, q_length, 1, d]`) in a
  `lax.map` whose body is rematerialised (`jax.checkpoint`): only one row's
  `[length, f]` feature tensors exist at once, and the backward pass recomputes
  them instead of keeping `[batch * heads, length, f]` of them. Same values; on
  one CPU core, where those tensors' memory traffic costs more than their
  arithmetic, it made Performer's forward + backward (8 heads, 256 features,
  4096 tokens) about 1.3x faster; a GPU wants all rows at once (`LOOP_ROWS`).
  """
  b, h = q.shape[0], q.shape[2]
  if h == 1 and not loop_rows:
    return fn(q, k, v, mask=key_padding, return_state=return_state, **kwargs)

  def fold(x):
    return jnp.swapaxes(x, 1, 2).reshape(b * h, x.shape[1], 1, x.shape[-1])

  kp = None if key_padding is None else jnp.repeat(key_padding, h, axis=0)
  if loop_rows:

    def row(args):
      q1, k1, v1, kp1 = (None if x is None else x[None] for x in args)
      res = fn(q1, k1, v1, mask=kp1, return_state=return_state, **kwargs)
      return jax.tree.map(lambda x: x[0], res)

    res = lax.map(jax.checkpoint(row, prevent_cse=False), (fold(q), fold(k), fold(v), kp))
  else:
    res = fn(fold(q), fold(k), fold(v), mask=kp, return_state=return_state, **kwargs)
  out, state = res if return_state else (res, None)
  out = jnp.swapaxes(out.reshape(b, h, q.shape[1], out.shape[-1]), 1, 2)
  if not return_state:
    return out
  return out, jax.tree.map(lambda s: s.reshape((b, h) + s.shape[2:]), state)


def _incoming_state(phi_k, num_k, v, log_g, axis: str):
  """The causal state (S, Z) `[b, h, f, dv]`, `[b, h, f]` of the keys on the devices before
  this one on `axis`: each block's summary (its keys' S and Z, decayed to the block's end
  by a gate, and the gate's total decay), combined by `collectives.exclusive_scan`."""
  if log_g is None:
    decay, weights = None, None
  else:
    cum = jnp.cumsum(log_g, axis=1)  # [b, n, h]
    decay = jnp.exp(cum[:, -1])  # [b, h]: the block's total decay
    weights = jnp.exp(cum[:, -1:] - cum)[..., None]  # each key decayed to the block's end
  scaled = lambda x: x if weights is None else x * weights
  summary = (decay, jnp.einsum('bkhf,bkhd->bhfd', scaled(num_k), v), jnp.sum(scaled(phi_k), axis=1))

  def combine(earlier, later):
    a1, s1, z1 = earlier
    a2, s2, z2 = later
    if a2 is None:
      return None, s1 + s2, z1 + z2
    return a1 * a2, a2[..., None, None] * s1 + s2, a2[..., None] * z1 + z2

  identity = jax.tree.map(lambda x: jnp.ones_like(x) if x.ndim == 2 else jnp.zeros_like(x), summary)
  _, s, z = collectives.exclusive_scan(combine, summary, identity, axis)
  return s, z


def _causal_chunked(phi_q, phi_k, v, log_g, eps, normalize, chunk_size, numerator=None, state=None):
  """Chunked causal scan; inputs already in the compute dtype and masked.

  `numerator`: optional (num_q, num_k) features of the numerator (see
  `kernel_attention`); the denominator then uses phi_q, phi_k. `state`: the initial
  (S, Z) (None: zeros).
  """
  b, n, h, f = phi_q.shape
  dv = v.shape[-1]
  c = max(1, min(int(causal_chunk_size(chunk_size)), n))
  nc = -(-n // c)
  pad = nc * c - n

  def chunks(x):
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((b, nc, c) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0)  # [nc, b, c, ...]

  xs = (
    chunks(phi_q),
    chunks(phi_k),
    chunks(v),
    None if log_g is None else chunks(log_g),
    None if numerator is None else tuple(chunks(x) for x in numerator),
  )
  tri = jnp.tril(jnp.ones((c, c), bool))  # [q, k]: k <= q

  def body(carry, x):
    s, z = carry  # [b,h,f,dv], [b,h,f]
    pq, pk, vc, lg, nums = x
    nq, nk = (pq, pk) if nums is None else nums
    a_den = jnp.einsum('bqhf,bkhf->bhqk', pq, pk)
    a = a_den if nums is None else jnp.einsum('bqhf,bkhf->bhqk', nq, nk)
    if lg is None:
      a = jnp.where(tri, a, 0.0)
      a_den = a if nums is None else jnp.where(tri, a_den, 0.0)
      inter_s = jnp.einsum('bqhf,bhfd->bqhd', nq, s)
      inter_z = jnp.einsum('bqhf,bhf->bqh', pq, z)
      pk_state, nk_state = pk, nk
      s_decay = None
    else:
      cum = jnp.cumsum(lg, axis=1)  # [b, c, h], log prod_{s<=t} g_s
      cum_t = jnp.swapaxes(cum, 1, 2)  # [b, h, c]
      diff = cum_t[..., :, None] - cum_t[..., None, :]  # log prod_{j<s<=t} g_s
      decay = jnp.where(tri, jnp.exp(jnp.where(tri, diff, 0.0)), 0.0)
      a = a * decay
      a_den = a if nums is None else a_den * decay
      q_decay = jnp.exp(cum)[..., None]  # [b, c, h, 1]
      inter_s = jnp.einsum('bqhf,bhfd->bqhd', nq, s) * q_decay
      inter_z = jnp.einsum('bqhf,bhf->bqh', pq, z) * q_decay[..., 0]
      last = cum[:, -1:]  # [b, 1, h]
      pk_state = pk * jnp.exp(last - cum)[..., None]
      nk_state = pk_state if nums is None else nk * jnp.exp(last - cum)[..., None]
      s_decay = jnp.exp(last[:, 0])  # [b, h]
    num = jnp.einsum('bhqk,bkhd->bqhd', a, vc) + inter_s
    if normalize:
      den = jnp.swapaxes(jnp.sum(a_den, axis=-1), 1, 2) + inter_z  # [b, c, h]
      out = normalize_by(num, den, eps)
    else:
      out = num
    if s_decay is not None:
      s = s * s_decay[..., None, None]
      z = z * s_decay[..., None]
    s = s + jnp.einsum('bkhf,bkhd->bhfd', nk_state, vc)
    z = z + jnp.sum(pk_state, axis=1)
    return (s, z), out

  init = (jnp.zeros((b, h, f, dv), phi_q.dtype), jnp.zeros((b, h, f), phi_q.dtype))
  if state is not None:
    init = tuple(x.astype(phi_q.dtype) for x in state)
  (s, z), out = lax.scan(jax.checkpoint(body, prevent_cse=False), init, xs)
  out = jnp.moveaxis(out, 0, 1).reshape(b, nc * c, h, dv)[:, :n]
  return out, (s, z)


def _as_token(x: jnp.ndarray):
  """`[batch, heads, dim]` or `[batch, 1, heads, dim]` -> `[batch, heads, dim]`."""
  if x.ndim == 4:
    if x.shape[1] != 1:
      raise ValueError(f'a decoding step takes one token, got shape {x.shape}')
    return x[:, 0], True
  if x.ndim != 3:
    raise ValueError(
      f'token must be [batch, heads, dim] or [batch, 1, heads, dim], got shape {x.shape}'
    )
  return x, False


def kernel_attention_step(
  state: KernelState,
  phi_q_t: jnp.ndarray,
  phi_k_t: jnp.ndarray,
  v_t: jnp.ndarray,
  eps: float = 1e-6,
  normalize: bool = True,
  gate_t: Optional[jnp.ndarray] = None,
  key_valid: Optional[jnp.ndarray] = None,
  num_q: Optional[jnp.ndarray] = None,
  num_k: Optional[jnp.ndarray] = None,
):
  """One causal decoding step: add token t's key/value to the state, then read it.

      S_t = S_{t-1} + phi_k_t v_t^T          (gated: g S_{t-1} + (1 - g) phi_k_t v_t^T)
      Z_t = Z_{t-1} + phi_k_t                (gated: g Z_{t-1} + (1 - g) phi_k_t)
      out_t = phi_q_t^T S_t / safe(phi_q_t . Z_t)     (or phi_q_t^T S_t)

  Feeding tokens 0..n-1 in order reproduces `kernel_attention(..., causal=True)`.
  Time and memory O(f dv) per (batch, head), independent of t.

  Grouped-query attention: the state, phi_k_t and v_t may have kv_heads heads, a
  divisor of phi_q_t's; query head i reads state i // (heads / kv_heads).

  Args:
    state: `KernelState` from `init_kernel_state` (or a prefill's final state).
    phi_q_t: `[batch, heads, f]` (or `[batch, 1, heads, f]`, see Returns).
    phi_k_t: `[batch, heads, f]` (or `[batch, 1, heads, f]`).
    v_t: `[batch, heads, dv]` (or `[batch, 1, heads, dv]`).
    eps, normalize: as in `kernel_attention`.
    gate_t: optional `[batch, heads]` (or `[batch, 1, heads]`) gate in (0, 1).
    key_valid: optional bool `[batch]`: False leaves that row's state untouched
      (a padded / finished sequence); the output still reads the state.
    num_q, num_k: optional numerator features of this token (see `kernel_attention`).

  Returns:
    (new_state, out_t): out_t is `[batch, heads, dv]`, or `[batch, 1, heads, dv]`
    if phi_q_t had that layout, in v_t's dtype.
  """
  phi_q_t, keep_axis = _as_token(phi_q_t)
  phi_k_t, _ = _as_token(phi_k_t)
  v_t, _ = _as_token(v_t)
  nq = phi_q_t if num_q is None else _as_token(num_q)[0]
  nk = phi_k_t if num_k is None else _as_token(num_k)[0]
  compute = jnp.promote_types(state.s.dtype, _compute_dtype(phi_q_t, phi_k_t, v_t, nq, nk))
  q, k, vv, nq, nk = (x.astype(compute) for x in (phi_q_t, phi_k_t, v_t, nq, nk))
  s, z = state.s.astype(compute), state.z.astype(compute)
  if key_valid is not None:
    valid = jnp.asarray(key_valid, bool)[:, None, None]
    k = jnp.where(valid, k, 0.0)
    nk = jnp.where(valid, nk, 0.0)
    vv = jnp.where(valid, vv, 0.0)
  kv = nk[..., :, None] * vv[..., None, :]  # [b, h, f, dv]
  if gate_t is None:
    s, z = s + kv, z + k
  else:
    g = gate_t[:, 0] if gate_t.ndim == 3 else gate_t
    g = g.astype(compute)
    if key_valid is not None:
      g = jnp.where(valid[..., 0], g, 1.0)
    s = g[..., None, None] * s + (1.0 - g)[..., None, None] * kv
    z = g[..., None] * z + (1.0 - g)[..., None] * k
  groups = lambda x: x.reshape(x.shape[0], s.shape[1], -1, x.shape[-1])  # [b, kv_h, g, f]
  out = jnp.einsum('bngf,bnfd->bngd', groups(nq), s).reshape(vv.shape[0], -1, s.shape[-1])
  if normalize:
    den = jnp.einsum('bngf,bnf->bng', groups(q), z).reshape(out.shape[:2])
    out = normalize_by(out, den, eps)
  out = out.astype(v_t.dtype)
  if keep_axis:
    out = out[:, None]
  new_state = KernelState(s.astype(state.s.dtype), z.astype(state.z.dtype), state.log_scale)
  return new_state, out


# ----------------------------------------------------------------------------
# The declaration shared by the kernel mechanisms (linear, RFA, Performer).
# ----------------------------------------------------------------------------

CHUNK_SIZE = registry.Option(
  'chunk_size',
  None,
  int,
  'chunk length of the causal scan; None: the platform\'s (64 on CPU, 256 on GPU and TPU)',
  minimum=1,
  allow_none=True,
)


class KernelMechanism(registry.Mechanism):
  """A kernel mechanism: causal, recurrent decoding of a `KernelState`, rotary on features.

  Subclasses give `feature_dim`, the width f of phi (the state is `[f, v_dim]`
  per head); it defaults to head_dim (feature maps applied elementwise).
  """

  causal = True
  decode = 'recurrent'
  rotary = 'features'
  sequence_parallel = 'prefix_state'

  def feature_dim(self, options: registry.Options, head_dim: int) -> int:
    """f, the width of the query and key features."""
    del options
    return head_dim

  def init_state(self, options, *, batch, heads, head_dim, v_dim):
    return init_kernel_state(batch, heads, self.feature_dim(options, head_dim), v_dim)

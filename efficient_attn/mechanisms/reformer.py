"""Reformer LSH attention (Kitaev et al., 2020), as trax's `LSHSelfAttention`.

Shared query-key attention: the keys are the queries themselves, length
normalised, so only `q` and `v` are read (the `k` argument is ignored and may
be None). For each of `n_hashes` rounds:

  1. hash: bucket(x) = argmax([x R; -x R]) with a random rotation R
     `[head_dim, n_buckets // 2]` per round and head (angular LSH, Andoni et
     al., 2015), drawn once from `jax.random.PRNGKey(seed)` (a fixed draw:
     the same for every call and batch element); padded tokens go to an extra
     bucket n_buckets, after every real token;
  2. sort the tokens by (bucket, position);
  3. cut the sorted sequence into chunks of `chunk_size`; each query attends
     to the keys of its own chunk and of the previous chunk (the first chunk
     has no previous chunk: unlike trax there is no wrap-around);
  4. a token does not attend to itself unless it has no other key: its own
     score is lowered by `SELF_SCORE_PENALTY` (1e5, a large finite number, as
     trax does); causal: only the chunk_size most recent earlier keys of the
     query's own bucket (see Causality below); padded keys are masked;
  5. each round gives an output o_r and the log-sum-exp l_r of its scores,
     and the rounds are combined as sum_r softmax_r(l_r) o_r, i.e. a softmax
     over the union (with multiplicity) of the keys each round offered.

Scores: s_ij = scale * q_i . k_j with k_j = q_j / rms(q_j) (trax's
`length_normalized`: q_j l2-normalised to norm sqrt(head_dim)); with the
default scale 1/sqrt(head_dim) this is q_i . q_j / ||q_j||, exactly trax's.

With one bucket (`n_buckets=1`, allowed specially: no hashing, sorting is the
identity) and `chunk_size >= length`, this is exact shared-QK softmax
attention with the self-mask.

Causality (`causal=True`) is strict: nothing at position t depends on any token
after t. Masking later keys inside the chunks of step 3 is not enough, since
where the chunk boundaries fall in the sorted order depends on how every token
hashes, later ones included (a later token in a lower bucket shifts them), so
later tokens would decide which earlier keys a query sees. The causal form
therefore gives query t, in each round, the keys the paper's set P_t = {j :
h(j) = h(t)} restricted to the past allows: the `chunk_size` most recent
earlier tokens of t's own bucket (the sorted positions just before t, which the
own and previous chunk always hold), and itself only when it has no other key.
That set, each round's output and log-sum-exp, and so their combination depend
on the hashes of tokens <= t alone. (In floating point, outputs up to t agree
to round-off, about 1e-7, when later tokens change: where those keys sit in the
chunk layout, and so the order of the sums, still follows the sort. The
non-causal form attends to the whole own and previous chunk, every bucket in
them, as trax does.)

Cost per head: time O(n_hashes n (chunk_size d + log n)) (the sort), memory
O(n_hashes n chunk_size). Self-attention only (q_length == kv_length): q
`[batch, n, heads, head_dim]`, v `[batch, n, heads, v_dim]`, output `[batch, n,
heads, v_dim]`.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import masking
from efficient_attn.ops.per_head_mlp import ParamSpecs
from efficient_attn.ops.scaled_dot_product import default_scale
from efficient_attn.ops.scaled_dot_product import masked_softmax

# Lowering of a token's score for itself (trax's `mask_self_attention`).
SELF_SCORE_PENALTY = 1e5
# Epsilon of the key length normalisation x / sqrt(mean(x^2) + eps) (trax's).
LENGTH_NORM_EPS = 1e-6


def param_specs(
  *, heads: int, head_dim: int, max_length: Optional[int] = None, **options
) -> ParamSpecs:
  """LSH attention has no learned parameters (its rotations come from `seed`): {}."""
  del heads, head_dim, max_length, options
  return {}


def lsh_rotations(
  seed: int, heads: int, head_dim: int, n_buckets: int, n_hashes: int
) -> jnp.ndarray:
  """The fixed random rotations, `[heads, n_hashes, head_dim, n_buckets // 2]` float32.

  Standard normal entries drawn from `jax.random.PRNGKey(seed)`. With
  n_buckets == 1 the last axis is empty (no hashing). The draw is evaluated
  when traced (`jax.ensure_compile_time_eval`), so a jitted caller embeds the
  rotations as a constant instead of compiling the random number generator.
  """
  shape = (heads, n_hashes, head_dim, n_buckets // 2)
  if n_buckets // 2 == 0:
    return jnp.zeros(shape, jnp.float32)
  with jax.ensure_compile_time_eval():
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def lsh_buckets(x, rotations) -> jnp.ndarray:
  """Angular LSH buckets `[batch, heads, n_hashes, n]` int32 of `x` `[batch, n, heads, d]`.

  bucket = argmax([x R; -x R]) in [0, 2 * rotations.shape[-1]); all zero when
  the rotations are empty (one bucket).
  """
  b, n, h, _ = x.shape
  n_hashes, half = rotations.shape[1], rotations.shape[-1]
  if half == 0:
    return jnp.zeros((b, h, n_hashes, n), jnp.int32)
  compute = jnp.promote_types(x.dtype, jnp.float32)
  rot = jnp.einsum('bnhd,hrdk->bhrnk', x.astype(compute), rotations.astype(compute))
  return jnp.argmax(jnp.concatenate([rot, -rot], axis=-1), axis=-1).astype(jnp.int32)


def _previous_chunk(x, fill):
  """`x` `[..., C, chunk, ...]` (chunk axis 3) shifted by one chunk; chunk 0 gets `fill`."""
  first = jnp.full_like(x[:, :, :, :1], fill)
  return jnp.concatenate([first, x[:, :, :, :-1]], axis=3)


def reformer_attention(
  q,
  k,
  v,
  mask=None,
  causal: bool = False,
  *,
  n_buckets: int = 32,
  n_hashes: int = 2,
  chunk_size: int = 64,
  seed: int = 0,
  scale: Optional[float] = None,
):
  """Multi-round LSH attention with shared queries and keys (see module docstring).

  Scores, softmax and the round combination run in float32 (or wider); the
  result has the dtype of `v`.

  Args:
    q: `[batch, n, heads, head_dim]`; also the keys (length normalised).
    k: ignored (shared query-key attention); may be None.
    v: `[batch, n, heads, v_dim]`.
    mask: optional bool key padding `[batch, n]` or flax-style mask (reduced to
      key padding); True = attend. Padded tokens are hashed into their own
      bucket, so they never displace real tokens from a chunk.
    causal: query i attends only to keys j <= i.
    n_buckets: hash buckets per round: 1, or an even number >= 2.
    n_hashes: hashing rounds (>= 1).
    chunk_size: chunk length; capped at n, and n must be divisible by it.
    seed: seed of the fixed random rotations (`lsh_rotations`).
    scale: score scale, default 1/sqrt(head_dim).

  Returns:
    `[batch, n, heads, v_dim]`, dtype of `v`. Query rows with no attendable key
    (possible only for padded queries) return 0.
  """
  del k
  b, n, h, d = q.shape
  if v.shape[:3] != (b, n, h):
    raise ValueError(
      f'reformer_attention is self-attention: v must be [batch={b}, n={n}, '
      f'heads={h}, v_dim], got shape {v.shape}'
    )
  if n_buckets < 1 or (n_buckets > 1 and n_buckets % 2):
    raise ValueError(f'n_buckets must be 1 or an even number >= 2, got {n_buckets}')
  registry.check_arguments(
    'reformer', 'reformer_attention', n_hashes=n_hashes, chunk_size=chunk_size
  )
  chunk = min(chunk_size, n)
  if n % chunk:
    raise ValueError(f'Reformer length {n} is not divisible by chunk_size={chunk_size}')
  num_chunks = n // chunk
  compute = jnp.promote_types(jnp.promote_types(q.dtype, v.dtype), jnp.float32)
  scale = default_scale(d, scale)
  key_padding = masking.key_padding_from_mask(mask, b, n)
  real = jnp.ones((b, n), bool) if key_padding is None else key_padding

  # Hash and sort (not differentiated: integer buckets and permutations).
  x = q.astype(compute)
  buckets = lsh_buckets(x, lsh_rotations(seed, h, d, n_buckets, n_hashes))
  buckets = jnp.where(real[:, None, None, :], buckets, n_buckets)  # [b, h, r, n]
  pos = jnp.arange(n, dtype=jnp.int32)
  perm = jnp.argsort(buckets * n + pos, axis=-1)  # sorted -> original
  undo = jnp.argsort(perm, axis=-1)  # original -> sorted

  def sort(t):  # [b, n, h, e] -> [b, h, r, num_chunks, chunk, e]
    t = jnp.swapaxes(t, 1, 2)[:, :, None]  # [b, h, 1, n, e]
    t = jnp.take_along_axis(t, perm[..., None], axis=3)
    return t.reshape(b, h, n_hashes, num_chunks, chunk, t.shape[-1])

  keys = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + LENGTH_NORM_EPS)
  sq, sk, sv = sort(x), sort(keys), sort(v.astype(compute))
  spos = perm.reshape(b, h, n_hashes, num_chunks, chunk)
  sreal = jnp.take_along_axis(real[:, None, None, :], perm, axis=3).reshape(spos.shape)
  if num_chunks > 1:  # keys of the own and the previous chunk
    sk = jnp.concatenate([sk, _previous_chunk(sk, 0)], axis=4)
    sv = jnp.concatenate([sv, _previous_chunk(sv, 0)], axis=4)
    kpos = jnp.concatenate([spos, _previous_chunk(spos, -1)], axis=4)
    kreal = jnp.concatenate([sreal, _previous_chunk(sreal, False)], axis=4)
  else:
    kpos, kreal = spos, sreal

  s = jnp.einsum('bhrcqd,bhrckd->bhrcqk', sq, sk) * scale
  qp, kp = spos[..., :, None], kpos[..., None, :]
  s = jnp.where(qp == kp, s - SELF_SCORE_PENALTY, s)
  valid = kreal[..., None, :]
  if causal:  # the chunk most recent keys of the query's own bucket (module docstring)
    sbucket = jnp.take_along_axis(buckets, perm, axis=3).reshape(spos.shape)
    sidx = jnp.broadcast_to(
      jnp.arange(n, dtype=jnp.int32).reshape(num_chunks, chunk), spos.shape
    )  # sorted index
    kbucket, ksidx = sbucket, sidx
    if num_chunks > 1:
      kbucket = jnp.concatenate([sbucket, _previous_chunk(sbucket, -1)], axis=4)
      ksidx = jnp.concatenate([sidx, _previous_chunk(sidx, -n - 1)], axis=4)
    valid = (
      valid
      & (kp <= qp)
      & (kbucket[..., None, :] == sbucket[..., :, None])
      & (sidx[..., :, None] - ksidx[..., None, :] <= chunk)
    )
  w, lse = masked_softmax(s, valid)
  so = jnp.einsum('bhrcqk,bhrckd->bhrcqd', w, sv).reshape(b, h, n_hashes, n, -1)
  lse = lse.reshape(b, h, n_hashes, n)

  # Unsort and combine the rounds with their log-sum-exp weights.
  options = jnp.take_along_axis(so, undo[..., None], axis=3)  # [b, h, r, n, dv]
  lse = jnp.take_along_axis(lse, undo, axis=3)
  if n_hashes > 1:
    options = jnp.sum(jax.nn.softmax(lse, axis=2)[..., None] * options, axis=2)
  else:
    options = options[:, :, 0]
  return jnp.swapaxes(options, 1, 2).astype(v.dtype)


@registry.register
class Reformer(registry.Mechanism):
  """Shared query-key: the layer skips the key projection and passes the queries."""

  name = 'reformer'
  rotary = 'scores'
  description = 'LSH attention over shared query-keys, chunked'
  citation = 'Kitaev et al. 2020'
  options = (
    registry.Option('n_buckets', 32, int, 'hash buckets (1, or even)', minimum=1),
    registry.Option('n_hashes', 2, int, 'hashing rounds', minimum=1),
    registry.Option('chunk_size', 64, int, 'chunk length c (must divide the length)', minimum=1),
    registry.Option('seed', 0, int, 'seed of the random rotations', minimum=0),
    SCALE,
  )
  causal = True
  shared_qk = True
  self_attention_only = True
  complexity = ('O(r n c d)', 'O(r n c)')
  whole_sequence = 'it hashes and sorts the whole sequence into buckets'
  no_segments = 'its hash buckets and chunks span documents'
  knob = ('n_hashes', (1, 2, 4, 8))
  example = {'n_buckets': 4, 'chunk_size': 4}

  def check(self, options, *, length, max_length, causal):
    if options.n_buckets != 1 and options.n_buckets % 2:
      raise ValueError(
        f"option n_buckets={options.n_buckets} of mechanism 'reformer' is not valid; "
        f'it must be 1 or even'
      )
    if length % min(options.chunk_size, length):
      raise ValueError(
        f"option chunk_size={options.chunk_size} of mechanism 'reformer' does not "
        f'divide the sequence length {length}; valid: a divisor of {length}'
      )

  def reference(self, options, q, k, v):
    """Full shared-QK softmax with the self-mask (one bucket, one round, one chunk)."""
    del k
    return reformer_attention(
      q, q, v, n_buckets=1, n_hashes=1, chunk_size=q.shape[1], scale=options.scale
    )

  def exact_options(self, length):
    return {'n_buckets': 1, 'n_hashes': 1, 'chunk_size': length}

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return reformer_attention(
      q,
      k,
      v,
      mask=mask,
      causal=causal,
      n_buckets=options.n_buckets,
      n_hashes=options.n_hashes,
      chunk_size=options.chunk_size,
      seed=options.seed,
      scale=options.scale,
    )

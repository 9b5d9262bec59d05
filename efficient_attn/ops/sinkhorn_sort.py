"""The learned block sort of Sinkhorn attention (Tay et al., 2020): each key block's
summary, the sorting network's block logits, and Gumbel-Sinkhorn balancing into a soft
permutation (Mena et al., 2018). `efficient_attn/mechanisms/sinkhorn.py` attends with it.

Shapes: keys `[batch, n, heads, head_dim]`, summaries `[batch, N, heads, head_dim]` (N = n
/ block_size), logits and permutations `[batch, heads, N, N]`.
"""

import jax
import jax.numpy as jnp

from efficient_attn.ops import masking
from efficient_attn.ops.per_head_mlp import per_head_mlp
from efficient_attn.ops.per_head_mlp import require_params

SORT_PARAMS = ('sort_w1', 'sort_b1', 'sort_w2', 'sort_b2')


def _shift_blocks(x):
  """`x` `[batch, N, ...]` moved one block later along axis 1, zeros first."""
  return jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)


def block_summaries(k, key_padding, block_size: int, causal: bool = False):
  """Mean of the real keys of each block, `[batch, N, heads, head_dim]` (float32+).

  Non-causal: row i summarises block i. Causal: row i summarises blocks
  0 .. i-1 (row 0 is zero). Blocks with no real key give zero.
  """
  b, n, h, d = k.shape
  nb = n // block_size
  compute = jnp.promote_types(k.dtype, jnp.float32)
  real = (jnp.ones((b, n), bool) if key_padding is None else key_padding).astype(compute)
  kz = k.astype(compute) * real[:, :, None, None]
  sums = kz.reshape(b, nb, block_size, h, d).sum(axis=2)  # [b, N, h, d]
  counts = real.reshape(b, nb, block_size).sum(axis=2)  # [b, N]
  if causal:  # exclusive prefix over blocks: row i sums blocks 0 .. i-1
    sums = jnp.cumsum(_shift_blocks(sums), axis=1)
    counts = jnp.cumsum(_shift_blocks(counts), axis=1)
  return sums / jnp.maximum(counts, 1.0)[:, :, None, None]


def sort_logits(summaries, params, num_blocks: int):
  """The sorting network's block logits R `[batch, heads, N, N]` (float32+).

  Row i is MLP_h(summary_i)[:N]: how strongly key block j is sorted into
  position i.
  """
  require_params(params, SORT_PARAMS, 'sinkhorn_attention')
  h = summaries.shape[2]
  w2 = params['sort_w2']
  if w2.ndim != 3 or w2.shape[0] != h:
    raise ValueError(
      f"Sinkhorn param 'sort_w2' must be [heads={h}, hidden, max_blocks], got shape {w2.shape}"
    )
  compute = jnp.promote_types(summaries.dtype, jnp.float32)
  r = per_head_mlp(summaries, params, 'sort', compute)[..., :num_blocks]  # [b, N, h, N]
  return jnp.swapaxes(r, 1, 2)


def sample_gumbel(rng, shape, dtype=jnp.float32):
  """Standard Gumbel noise -log(-log(U)), U ~ Uniform(tiny, 1)."""
  tiny = jnp.finfo(dtype).tiny
  u = jax.random.uniform(rng, shape, dtype, minval=tiny, maxval=1.0)
  return -jnp.log(-jnp.log(u))


def gumbel_sinkhorn(
  logits, iterations: int = 8, temperature: float = 0.75, causal: bool = False, rng=None
):
  """Soft permutation `[..., N, N]` by log-domain Sinkhorn balancing (Mena et al., 2018).

  Args:
    logits: `[..., N, N]`, row i = target block i, column j = source block j.
    iterations: row-then-column normalisation rounds (>= 1).
    temperature: > 0; logits (plus noise) are divided by it.
    causal: mask to j < i and normalise columns over rows <= i (see module
      docstring); masked entries are exactly 0.
    rng: optional PRNG key for Gumbel noise (training); None: deterministic.

  Returns:
    P in float32 (or wider). Time O(iterations N^2), memory O(N^2) (times
    iterations for the backward pass).
  """
  compute = jnp.promote_types(logits.dtype, jnp.float32)
  x = logits.astype(compute)
  if rng is not None:
    x = x + sample_gumbel(rng, x.shape, compute)
  x = x / temperature
  nb = x.shape[-1]
  if causal:
    valid = jnp.arange(nb)[None, :] < jnp.arange(nb)[:, None]
  else:
    valid = jnp.ones((nb, nb), bool)
  neg = masking.big_neg(compute)

  def normalise(_, x):
    x = jnp.where(valid, x - jax.nn.logsumexp(x, axis=-1, keepdims=True), neg)
    if causal:
      col = jax.lax.cumlogsumexp(x, axis=x.ndim - 2)
    else:
      col = jax.nn.logsumexp(x, axis=-2, keepdims=True)
    return jnp.where(valid, x - col, neg)

  x = jax.lax.fori_loop(0, iterations, normalise, jnp.where(valid, x, neg))
  return jnp.where(valid, jnp.exp(x), 0.0)

"""Sparse Sinkhorn attention (Tay et al., 2020): attention within learned-sorted blocks.

The keys and values are cut into N = n / B blocks of B tokens. A learned
sorting network maps a summary of each key block (the mean of its real keys)
to a row of block logits R `[N, N]`; Gumbel-Sinkhorn balancing turns R into a
soft permutation P (approximately doubly stochastic), in the log domain:

  L = (R + g) / temperature,  g ~ Gumbel(0, 1) only when an `rng` is given,
  repeat `sinkhorn_iterations` times: normalise the rows, then the columns,
  P = exp(L).

The sorted blocks are K^s_i = sum_j P_ij K_j, V^s_i = sum_j P_ij V_j (position
s of sorted block i mixes position s of every block). Each query block i then
attends, with one joint softmax, to its own (local) key block i and to the
sorted block i: 2 B keys per query.

Causal form (the paper's Causal Sinkhorn Balancing, in this concrete form):
  * the summary feeding row i of R is the mean of the real keys of blocks
    0 .. i-1 (a cumulative mean of strictly past blocks; zero for block 0);
  * R is masked to j < i before balancing, so sorted block i mixes only past
    blocks (block 0 has no sorted block);
  * the row normalisation runs over j < i and the column normalisation of
    entry (i, j) over the rows i' <= i only (a prefix log-sum-exp down the
    column), so P's row i depends on rows 0 .. i of R, i.e. on blocks < i;
  * the local block is causally masked (key s <= query t).
With this, output t depends on no input at a position > t (neither its value
nor its gradient). P is then not doubly stochastic: its rows sum to at most 1
and row 0 is empty.

SortCut (`sortcut_k > 0`, non-causal only): every query attends (globally,
without its local block) to the first `sortcut_k` sorted blocks, sortcut_k B
keys; queries need not be blocked, so q_length may differ from kv_length.

Key padding: padded keys and values are zeroed before they are summarised or
sorted; a local key is masked if padded, and a sorted slot (i, s) is masked if
no real key reaches it (sum_j P_ij real_js == 0, e.g. when the support of P
only meets padded positions), as in the Long Range Arena implementation.

Sorting network (`param_specs`): one 2-layer MLP per head, head_dim -> hidden
-> max_length // block_size (ReLU between; parameters sort_w1, sort_b1,
sort_w2, sort_b2). Inputs with N < max_length // B blocks use the first N
output columns (like Linformer's first n columns). The mechanism is therefore
fixed-length: n must divide by block_size and not exceed max_length.

Cost per head: the local and sorted attention O(n B d) time and O(n B)
memory; the block sort O(N^2 (sinkhorn_iterations + B d)) = O(n^2 d / B) time
(cheap: N = n / B) and O(N^2 + n d) memory. SortCut: O(q_length sortcut_k B d)
time and O(q_length sortcut_k B) memory, plus the sort. Shapes: q `[batch,
q_length, heads, head_dim]`, k `[batch, n, heads, head_dim]`, v `[batch, n,
heads, v_dim]`, output `[batch, q_length, heads, v_dim]`.
"""

from typing import Optional

import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import masking
from efficient_attn.ops.per_head_mlp import ParamSpecs
from efficient_attn.ops.per_head_mlp import mlp_param_specs
from efficient_attn.ops.per_head_mlp import require_params
from efficient_attn.ops.scaled_dot_product import default_scale
from efficient_attn.ops.scaled_dot_product import masked_softmax
from efficient_attn.ops.sinkhorn_sort import SORT_PARAMS
from efficient_attn.ops.sinkhorn_sort import block_summaries
from efficient_attn.ops.sinkhorn_sort import gumbel_sinkhorn
from efficient_attn.ops.sinkhorn_sort import sample_gumbel  # noqa: F401 (re-exported)
from efficient_attn.ops.sinkhorn_sort import sort_logits


def param_specs(
  *,
  heads: int,
  head_dim: int,
  max_length: Optional[int] = None,
  block_size: int = 64,
  sort_hidden_dim: Optional[int] = None,
  **options,
) -> ParamSpecs:
  """Shapes and initialisers of the sorting network (one 2-layer MLP per head).

  Args:
    heads, head_dim: attention heads and key dimension.
    max_length: the longest input (required); must be a multiple of block_size.
    block_size: tokens per block B.
    sort_hidden_dim: hidden width, default head_dim.
    **options: other options of `sinkhorn_attention` (ignored).

  Returns:
    {'sort_w1': ([heads, head_dim, hidden], LeCun normal), 'sort_b1': ([heads,
    hidden], zeros), 'sort_w2': ([heads, hidden, max_length // block_size], ..),
    'sort_b2': ([heads, max_length // block_size], zeros)}.
  """
  del options
  if max_length is None:
    raise ValueError(
      'Sinkhorn param_specs needs max_length (the sorting network has '
      'max_length // block_size outputs); got max_length=None'
    )
  registry.check_arguments(
    'sinkhorn', 'Sinkhorn param_specs', block_size=block_size, sort_hidden_dim=sort_hidden_dim
  )
  if max_length < block_size or max_length % block_size:
    raise ValueError(
      f'max_length={max_length} must be a positive multiple of block_size={block_size}'
    )
  hidden = head_dim if sort_hidden_dim is None else sort_hidden_dim
  return mlp_param_specs('sort', heads, head_dim, hidden, max_length // block_size)


def _check(q, k, v, block_size, sinkhorn_iterations, temperature, sortcut_k, causal):
  b, n, h, d = k.shape
  if q.shape[0] != b or q.shape[2] != h or q.shape[3] != d:
    raise ValueError(
      f'q must be [batch={b}, q_length, heads={h}, head_dim={d}], got shape {q.shape}'
    )
  if v.shape[:3] != (b, n, h):
    raise ValueError(f'v must be [batch={b}, kv_length={n}, heads={h}, v_dim], got shape {v.shape}')
  registry.check_arguments(
    'sinkhorn',
    'sinkhorn_attention',
    block_size=block_size,
    sinkhorn_iterations=sinkhorn_iterations,
    temperature=temperature,
    sortcut_k=sortcut_k,
  )
  if n % block_size:
    raise ValueError(f'Sinkhorn kv length {n} is not divisible by block_size={block_size}')
  nb = n // block_size
  if sortcut_k > nb:
    raise ValueError(f'sortcut_k must be in [0, num_blocks={nb}], got {sortcut_k}')
  if sortcut_k and causal:
    raise ValueError(
      f'sortcut_k={sortcut_k} (SortCut) is non-causal: every query sees the '
      'first sorted blocks, which mix all positions; use causal=False'
    )
  if not sortcut_k and q.shape[1] != n:
    raise ValueError(
      f'Sinkhorn attention needs q_length == kv_length unless sortcut_k > 0, '
      f'got {q.shape[1]} and {n}'
    )


def sinkhorn_attention_from_logits(
  q,
  k,
  v,
  logits,
  mask=None,
  causal: bool = False,
  *,
  block_size: int = 64,
  sinkhorn_iterations: int = 8,
  temperature: float = 0.75,
  sortcut_k: int = 0,
  rng=None,
  scale: Optional[float] = None,
):
  """Sinkhorn attention given the block logits R (the sorting network's output).

  Args: as `sinkhorn_attention`, with `logits` `[batch|1, heads|1, N, N]`
    (N = kv_length // block_size) in place of `params`.

  Returns:
    `[batch, q_length, heads, v_dim]`, dtype of `v`.
  """
  _check(q, k, v, block_size, sinkhorn_iterations, temperature, sortcut_k, causal)
  b, n, h, d = k.shape
  nb, bs = n // block_size, block_size
  if logits.ndim != 4 or logits.shape[-2:] != (nb, nb):
    raise ValueError(
      f'Sinkhorn logits must be [batch, heads, {nb}, {nb}], got shape {logits.shape}'
    )
  compute = jnp.promote_types(jnp.promote_types(q.dtype, v.dtype), jnp.float32)
  scale = default_scale(d, scale)
  key_padding = masking.key_padding_from_mask(mask, b, n)
  real = jnp.ones((b, n), bool) if key_padding is None else key_padding

  perm = gumbel_sinkhorn(logits, sinkhorn_iterations, temperature, causal, rng)
  perm = jnp.broadcast_to(perm.astype(compute), (b, h, nb, nb))
  kb = masking.zero_padded(k, real).astype(compute).reshape(b, nb, bs, h, d)
  vb = masking.zero_padded(v, real).astype(compute).reshape(b, nb, bs, h, -1)
  realb = real.reshape(b, nb, bs)
  ks = jnp.einsum('bhij,bjshd->bishd', perm, kb)  # [b, N, B, h, d]
  vs = jnp.einsum('bhij,bjshd->bishd', perm, vb)
  # Sorted slot (i, s) is valid where some real key reaches it.
  sorted_valid = jnp.einsum('bhij,bjs->bhis', perm, realb.astype(compute)) > 0

  if sortcut_k:
    kc = ks[:, :sortcut_k].reshape(b, sortcut_k * bs, h, d)
    vc = vs[:, :sortcut_k].reshape(b, sortcut_k * bs, h, -1)
    valid = sorted_valid[:, :, :sortcut_k].reshape(b, h, 1, sortcut_k * bs)
    s = jnp.einsum('bqhd,bkhd->bhqk', q.astype(compute), kc) * scale
    w, _ = masked_softmax(s, valid)
    return jnp.einsum('bhqk,bkhd->bqhd', w, vc).astype(v.dtype)

  qb = q.astype(compute).reshape(b, nb, bs, h, d)
  keys = jnp.concatenate([kb, ks], axis=2)  # [b, N, 2B, h, d]
  vals = jnp.concatenate([vb, vs], axis=2)
  local_valid = realb[:, :, None, None, :]  # [b, N, 1, 1, B]
  if causal:
    local_valid = local_valid & jnp.tril(jnp.ones((bs, bs), bool))
  local_valid = jnp.broadcast_to(local_valid, (b, nb, h, bs, bs))
  srt_valid = jnp.broadcast_to(
    jnp.swapaxes(sorted_valid, 1, 2)[:, :, :, None, :], (b, nb, h, bs, bs)
  )
  valid = jnp.concatenate([local_valid, srt_valid], axis=-1)  # [b, N, h, B, 2B]
  s = jnp.einsum('bcqhd,bckhd->bchqk', qb, keys) * scale
  w, _ = masked_softmax(s, valid)
  out = jnp.einsum('bchqk,bckhd->bcqhd', w, vals)
  return out.reshape(b, n, h, -1).astype(v.dtype)


def sinkhorn_attention(
  q,
  k,
  v,
  params,
  mask=None,
  causal: bool = False,
  *,
  block_size: int = 64,
  sinkhorn_iterations: int = 8,
  temperature: float = 0.75,
  sortcut_k: int = 0,
  rng=None,
  scale: Optional[float] = None,
):
  """Sparse Sinkhorn attention: local block + learned-sorted block, one softmax.

  See the module docstring for the algorithm, the causal form, SortCut and
  the cost. Scores, sorting and softmax run in float32 (or wider); the result
  has the dtype of `v`.

  Args:
    q: `[batch, n, heads, head_dim]` (any q_length with `sortcut_k > 0`).
    k: `[batch, n, heads, head_dim]`; n divisible by block_size, at most
      max_length = block_size * (columns of the sorting network).
    v: `[batch, n, heads, v_dim]`.
    params: the sorting network, as made from `param_specs`: sort_w1 `[heads,
      head_dim, hidden]`, sort_b1 `[heads, hidden]`, sort_w2 `[heads, hidden,
      max_length // block_size]`, sort_b2 `[heads, max_length // block_size]`.
    mask: optional bool key padding `[batch, n]` or flax-style mask (reduced to
      key padding); True = attend.
    causal: causal Sinkhorn attention (see module docstring).
    block_size: tokens per block B.
    sinkhorn_iterations: Sinkhorn normalisation rounds (>= 1).
    temperature: Gumbel-Sinkhorn temperature (> 0).
    sortcut_k: 0, or the number of sorted blocks every query attends to
      (SortCut, non-causal).
    rng: optional PRNG key for the Gumbel noise (training); None: deterministic.
    scale: score scale, default 1/sqrt(head_dim).

  Returns:
    `[batch, q_length, heads, v_dim]`, dtype of `v`. Query rows with no
    attendable key return 0.
  """
  _check(q, k, v, block_size, sinkhorn_iterations, temperature, sortcut_k, causal)
  b, n = k.shape[:2]
  nb = n // block_size
  require_params(params, SORT_PARAMS, 'sinkhorn_attention')
  max_blocks = params['sort_w2'].shape[-1]
  if nb > max_blocks:
    raise ValueError(
      f'Sinkhorn input length {n} exceeds max_length {max_blocks * block_size} '
      f'(= {max_blocks} blocks of block_size={block_size}) of its sorting network'
    )
  key_padding = masking.key_padding_from_mask(mask, b, n)
  summaries = block_summaries(k, key_padding, block_size, causal)
  logits = sort_logits(summaries, params, nb)
  return sinkhorn_attention_from_logits(
    q,
    k,
    v,
    logits,
    mask=key_padding,
    causal=causal,
    block_size=block_size,
    sinkhorn_iterations=sinkhorn_iterations,
    temperature=temperature,
    sortcut_k=sortcut_k,
    rng=rng,
    scale=scale,
  )


@registry.register
class Sinkhorn(registry.Mechanism):
  """Parameters: the sorting network, 'sort_w1' `[heads, head_dim, hidden]`, 'sort_b1',
  'sort_w2' `[heads, hidden, max_length // block_size]`, 'sort_b2'. Gumbel noise is
  added in training calls that have a 'dropout' rng."""

  name = 'sinkhorn'
  rotary = 'scores'
  description = 'learned block sorting (Gumbel-Sinkhorn) + local block'
  citation = 'Tay et al. 2020'
  options = (
    registry.Option('block_size', 64, int, 'tokens per block (must divide the length)', minimum=1),
    registry.Option('sinkhorn_iterations', 8, int, 'balancing iterations', minimum=1),
    registry.Option('temperature', 0.75, float, 'Gumbel-Sinkhorn temperature', above=0.0),
    registry.Option(
      'sortcut_k',
      0,
      int,
      'SortCut: attend to the first k sorted blocks (0: off; non-causal)',
      minimum=0,
    ),
    registry.Option(
      'sort_hidden_dim',
      None,
      int,
      "sorting network width; None: head_dim",
      minimum=1,
      allow_none=True,
    ),
    SCALE,
  )
  causal = True
  fixed_length = True
  self_attention_only = True
  complexity = ('O(n B d + (n / B)^2)', 'O(n B)')
  whole_sequence = "it sorts the whole sequence's blocks with a learned soft permutation"
  no_segments = "its learned sorting mixes blocks of the row's documents"
  knob = ('block_size', (8, 16, 32, 64, 128))
  example = {'block_size': 4}

  def check(self, options, *, length, max_length, causal):
    for what, n in (('sequence length', length), ('max_length', max_length)):
      if n % options.block_size:
        raise ValueError(
          f"option block_size={options.block_size} of mechanism 'sinkhorn' does not "
          f'divide the {what} {n}; valid: a divisor of {n}'
        )
    if options.sortcut_k > length // options.block_size:
      raise ValueError(
        f"option sortcut_k={options.sortcut_k} of mechanism 'sinkhorn' exceeds "
        f'the {length // options.block_size} blocks'
      )
    if options.sortcut_k and causal:
      raise ValueError(
        f"option sortcut_k={options.sortcut_k} of mechanism 'sinkhorn' has no "
        f'causal form; use sortcut_k=0 with causal=True'
      )

  def params(self, options, *, heads, head_dim, max_length, causal):
    return param_specs(
      heads=heads,
      head_dim=head_dim,
      max_length=max_length,
      block_size=options.block_size,
      sort_hidden_dim=options.sort_hidden_dim,
    )

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    rng = None if ctx.deterministic else ctx.rng('dropout')
    return sinkhorn_attention(
      q,
      k,
      v,
      params,
      mask=mask,
      causal=causal,
      block_size=options.block_size,
      sinkhorn_iterations=options.sinkhorn_iterations,
      temperature=options.temperature,
      sortcut_k=options.sortcut_k,
      rng=rng,
      scale=options.scale,
    )

"""Synthesizer attention (Tay et al., 2020): attention weights without (only) q.k.

The attention logits are *synthesised* instead of (or besides) being computed
from query-key dot products:

  'dense': per-token 2-layer MLP, B_i = W2 relu(W1 q_i + b1) + b2 in
    R^max_length, one MLP per head;
  'random': a learned (or fixed, `trainable_random=False`) logit matrix
    R `[heads, max_length, max_length]`, the same for every input;
  'factorized_dense': two small per-head MLPs give A_i in R^a and B_i in R^b
    with a * b = max_length, combined as C_i[t] = A_i[t // b] * B_i[t % b]
    (A repeated element-wise b times times B tiled a times, the paper's
    H_A(A) * H_B(B));
  'factorized_random': R = R1 R2^T with R1, R2 `[heads, max_length,
    factor_rank]`.

  out = softmax(B[:q_length, :kv_length] (+ w_h * scale * q k^T)) v

`mix_with_dot=True` is the paper's mixture of a synthetic and a dot-product
synthesiser, softmax(a1 S1 + a2 S2): the synthetic logits are added to the
scaled dot-product logits weighted by a learned scalar w_h per head
(parameter 'dot_weight' `[heads]`, initialised to 1, which is the plain sum of
the Long Range Arena implementation). The paper's weight a1 of the synthetic
term is not a separate parameter: it is absorbed by the synthetic parameters
themselves (b2 / W2 / R scale freely), except for a fixed random matrix.

Length handling: the parameters are shaped by `max_length`; inputs shorter than
max_length use the leading block of the synthetic logits (the first kv_length
columns, and for the random kinds the first q_length rows), as Linformer uses
the first n columns of its projections. Longer inputs raise ValueError. When
causal with q_length < kv_length, query i is position i + kv_length - q_length
(as in `masking.causal_mask`, e.g. one decoding step), so the random kinds use
rows kv_length - q_length .. kv_length - 1.

Masking: only key padding is honoured (as by the other fixed-length
mechanisms): a flax-style mask is reduced with `masking.key_padding_from_mask`
and padded key columns get zero weight; `causal=True` masks the logits to the
lower triangle (`masking.causal_mask`). The 'dense' and 'factorized_dense' logit
row i depends on q_i only and the 'random' kinds on no input, so causal
masking of the logits is enough for causality.

Its per-head MLP and parameter helpers live in `efficient_attn.ops.per_head_mlp`, its
masked softmax in `efficient_attn.ops.scaled_dot_product`.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.softmax import SCALE
from efficient_attn.ops import feature_maps
from efficient_attn.ops import masking
from efficient_attn.ops.per_head_mlp import ParamSpecs
from efficient_attn.ops.per_head_mlp import mlp_param_specs
from efficient_attn.ops.per_head_mlp import per_head_mlp
from efficient_attn.ops.per_head_mlp import require_params
from efficient_attn.ops.scaled_dot_product import default_scale
from efficient_attn.ops.scaled_dot_product import masked_softmax

KINDS = ('dense', 'random', 'factorized_dense', 'factorized_random')


def _default_factor(max_length: int) -> int:
  """The largest divisor of max_length that is <= sqrt(max_length)."""
  a = int(math.isqrt(max_length))
  while max_length % a:
    a -= 1
  return a


def param_specs(
  *,
  heads: int,
  head_dim: int,
  max_length: Optional[int] = None,
  kind: str = 'dense',
  mix_with_dot: bool = False,
  hidden_dim: Optional[int] = None,
  factor_a: Optional[int] = None,
  factor_rank: int = 8,
  **options,
) -> ParamSpecs:
  """Shapes and initialisers of the Synthesizer parameters of one layer.

  Args:
    heads, head_dim: attention heads and query dimension.
    max_length: the longest input (required: the parameters are length-shaped).
    kind: one of `KINDS`.
    mix_with_dot: add 'dot_weight' `[heads]` (initialised to 1).
    hidden_dim: hidden width of the dense MLPs, default head_dim.
    factor_a: 'factorized_dense' length a of the first factor (must divide
      max_length; b = max_length // a); default the largest divisor of
      max_length that is <= sqrt(max_length).
    factor_rank: 'factorized_random' rank k of R1, R2 `[heads, max_length, k]`.
    **options: other options of `synthesizer_attention` (ignored here, e.g.
      `trainable_random`: a fixed random matrix is still a parameter array,
      which `synthesizer_attention` does not differentiate; a wrapper may keep
      it outside the trainable collection).

  Returns:
    {name: (shape, initializer)}:
      'dense': dense_w1 `[h, d, hidden]`, dense_b1, dense_w2 `[h, hidden,
        max_length]`, dense_b2;
      'random': random `[h, max_length, max_length]`, N(0, 1);
      'factorized_dense': fa_* (d -> hidden -> a) and fb_* (d -> hidden -> b);
      'factorized_random': random1, random2 `[h, max_length, k]`,
        N(0, 1/sqrt(k)) so that R1 R2^T has unit-variance entries;
      plus dot_weight `[h]` if mix_with_dot.
  """
  del options
  if max_length is None:
    raise ValueError(
      'Synthesizer param_specs needs max_length (its logits are '
      'max_length wide); got max_length=None'
    )
  if max_length < 1:
    raise ValueError(f'max_length must be >= 1, got {max_length}')
  registry.check_arguments(
    'synthesizer', 'Synthesizer param_specs', kind=kind, hidden_dim=hidden_dim
  )
  hidden = head_dim if hidden_dim is None else hidden_dim
  if kind == 'dense':
    specs = mlp_param_specs('dense', heads, head_dim, hidden, max_length)
  elif kind == 'random':
    specs = {'random': ((heads, max_length, max_length), jax.nn.initializers.normal(stddev=1.0))}
  elif kind == 'factorized_dense':
    registry.check_arguments('synthesizer', 'Synthesizer param_specs', factor_a=factor_a)
    a = _default_factor(max_length) if factor_a is None else factor_a
    if max_length % a:
      raise ValueError(
        f'factor_a must be a positive divisor of max_length={max_length}, got {factor_a}'
      )
    specs = {
      **mlp_param_specs('fa', heads, head_dim, hidden, a),
      **mlp_param_specs('fb', heads, head_dim, hidden, max_length // a),
    }
  else:  # factorized_random
    registry.check_arguments('synthesizer', 'Synthesizer param_specs', factor_rank=factor_rank)
    init = jax.nn.initializers.normal(stddev=factor_rank**-0.25)
    specs = {
      'random1': ((heads, max_length, factor_rank), init),
      'random2': ((heads, max_length, factor_rank), init),
    }
  if mix_with_dot:
    specs['dot_weight'] = ((heads,), jax.nn.initializers.ones)
  return specs


def synthetic_logits(
  q, params, kind: str, kv_length: int, causal: bool = False, trainable_random: bool = True
):
  """The synthetic logits `[batch|1, heads, q_length, kv_length]` (float32 or wider).

  Args:
    q: `[batch, q_length, heads, head_dim]` (read by the dense kinds only).
    params: see `param_specs`.
    kind: one of `KINDS`.
    kv_length: number of keys; the first kv_length synthetic columns are used.
    causal: the random kinds use rows aligned at the end (see module docstring).
    trainable_random: False stops the gradient to the random kinds' matrices.
  """
  registry.check_arguments('synthesizer', 'synthetic_logits', kind=kind)
  lq, h = q.shape[1], q.shape[2]
  row0 = max(kv_length - lq, 0) if causal else 0  # position of query 0
  compute = jnp.promote_types(q.dtype, jnp.float32)

  def check_length(n, max_length, what):
    if n > max_length:
      raise ValueError(
        f'Synthesizer {what} length {n} exceeds max_length {max_length} of its {kind!r} parameters'
      )

  def check_heads(p, name):
    if p.shape[0] != h:
      raise ValueError(f'Synthesizer param {name!r} has {p.shape[0]} heads, inputs have {h}')

  if kind == 'dense':
    require_params(params, [f'dense_{n}' for n in ('w1', 'b1', 'w2', 'b2')], 'Synthesizer dense')
    check_heads(params['dense_w2'], 'dense_w2')
    check_length(kv_length, params['dense_w2'].shape[-1], 'key')
    logits = per_head_mlp(q, params, 'dense', compute)[..., :kv_length]  # [b, q, h, n]
    return jnp.swapaxes(logits, 1, 2)
  if kind == 'factorized_dense':
    require_params(
      params,
      [f'{p}_{n}' for p in ('fa', 'fb') for n in ('w1', 'b1', 'w2', 'b2')],
      'Synthesizer factorized_dense',
    )
    check_heads(params['fa_w2'], 'fa_w2')
    a, b = params['fa_w2'].shape[-1], params['fb_w2'].shape[-1]
    check_length(kv_length, a * b, 'key')
    fa = per_head_mlp(q, params, 'fa', compute)  # [b, q, h, a]
    fb = per_head_mlp(q, params, 'fb', compute)  # [b, q, h, b]
    logits = jnp.repeat(fa, b, axis=-1) * jnp.tile(fb, (1,) * (fb.ndim - 1) + (a,))
    return jnp.swapaxes(logits[..., :kv_length], 1, 2)
  if kind == 'random':
    require_params(params, ['random'], 'Synthesizer random')
    r = jnp.asarray(params['random'])
    if r.ndim != 3 or r.shape[1] != r.shape[2]:
      raise ValueError(
        f"Synthesizer param 'random' must be [heads, max_length, max_length], got shape {r.shape}"
      )
    check_heads(r, 'random')
    check_length(max(row0 + lq, kv_length), r.shape[-1], 'input')
    r = r[:, row0 : row0 + lq, :kv_length].astype(compute)
  else:  # factorized_random
    require_params(params, ['random1', 'random2'], 'Synthesizer factorized_random')
    r1, r2 = jnp.asarray(params['random1']), jnp.asarray(params['random2'])
    check_heads(r1, 'random1')
    check_length(row0 + lq, r1.shape[1], 'query')
    check_length(kv_length, r2.shape[1], 'key')
    r = jnp.einsum(
      'hik,hjk->hij', r1[:, row0 : row0 + lq].astype(compute), r2[:, :kv_length].astype(compute)
    )
  if not trainable_random:
    r = jax.lax.stop_gradient(r)
  return r[None]


def synthesizer_attention(
  q,
  k,
  v,
  params,
  mask=None,
  causal: bool = False,
  *,
  kind: str = 'dense',
  mix_with_dot: bool = False,
  trainable_random: bool = True,
  scale: Optional[float] = None,
):
  """softmax(synthetic logits (+ w_h * scale * q k^T), masked) v.

  Time per head: O(q_length kv_length v_dim) for the softmax and the mixing,
  plus the logits: 'dense' O(q_length hidden (head_dim + max_length)),
  'factorized_dense' O(q_length (hidden (head_dim + a + b) + kv_length)),
  'random' O(q_length kv_length), 'factorized_random' O(q_length kv_length
  rank), and O(q_length kv_length head_dim) more with `mix_with_dot`. Memory
  O(q_length kv_length) per head (the logit matrix is formed). The logits and
  softmax run in float32 (or wider); the result has v's dtype.

  Args:
    q: `[batch, q_length, heads, head_dim]`; feeds the dense kinds' MLPs and
      the dot-product term.
    k: `[batch, kv_length, heads, head_dim]`; read only if `mix_with_dot`.
    v: `[batch, kv_length, heads, v_dim]`.
    params: dict of arrays named as by `param_specs` for `kind` (plus
      'dot_weight' `[heads]` if `mix_with_dot`).
    mask: optional bool key padding `[batch, kv_length]` or flax-style mask
      (reduced to key padding); True = attend.
    causal: query i sees keys j <= i + (kv_length - q_length)
      (`masking.causal_mask`).
    kind: one of `KINDS`.
    mix_with_dot: add the dot-product logits (see module docstring).
    trainable_random: False makes the random kinds' matrices fixed
      (stop_gradient).
    scale: dot-product scale, default 1/sqrt(head_dim).

  Returns:
    `[batch, q_length, heads, v_dim]`, dtype of `v`. Query rows with no
    attendable key return 0.
  """
  b, lq, h, d = q.shape
  n = v.shape[1]
  if v.shape[0] != b or v.shape[2] != h:
    raise ValueError(f'v must be [batch={b}, kv_length, heads={h}, v_dim], got shape {v.shape}')
  compute = jnp.promote_types(jnp.promote_types(q.dtype, v.dtype), jnp.float32)
  logits = synthetic_logits(q, params, kind, n, causal, trainable_random).astype(compute)
  if mix_with_dot:
    require_params(params, ['dot_weight'], 'Synthesizer mix_with_dot')
    if k is None or k.shape[:3] != (b, n, h) or k.shape[-1] != d:
      raise ValueError(
        f'mix_with_dot needs k [batch={b}, kv_length={n}, heads={h}, '
        f'head_dim={d}], got {None if k is None else k.shape}'
      )
    w = jnp.asarray(params['dot_weight']).astype(compute).reshape(h)
    sc = default_scale(d, scale)
    dots = jnp.einsum('bqhd,bkhd->bhqk', q.astype(compute), k.astype(compute)) * sc
    logits = logits + w[None, :, None, None] * dots
  valid = jnp.ones((1, 1, lq, n), bool)
  key_padding = masking.key_padding_from_mask(mask, b, n)
  if key_padding is not None:
    valid = valid & key_padding[:, None, None, :]
  if causal:
    valid = valid & masking.causal_mask(lq, n)[None, None]
  weights, _ = masked_softmax(logits, valid)
  out = jnp.einsum('bhqk,bkhd->bqhd', weights, v.astype(compute))
  return out.astype(v.dtype)


_RANDOM_PARAMS = ('random', 'random1', 'random2')


@registry.register
class Synthesizer(registry.Mechanism):
  """Parameters by `kind` (see `param_specs`). With trainable_random=False the random
  matrices are a fixed draw from `seed` and the layer path, not parameters."""

  name = 'synthesizer'
  description = 'synthetic attention weights (dense / random / factorised)'
  citation = 'Tay et al. 2020'
  options = (
    registry.Option('kind', 'dense', str, 'how the logits are synthesised', choices=KINDS),
    registry.Option(
      'mix_with_dot', False, bool, 'add the dot-product logits with a learned weight per head'
    ),
    registry.Option('trainable_random', True, bool, "learn the 'random' kinds' matrices"),
    registry.Option(
      'hidden_dim', None, int, 'dense MLP width; None: head_dim', minimum=1, allow_none=True
    ),
    registry.Option(
      'factor_a',
      None,
      int,
      "'factorized_dense': first factor (divides max_length); None: about sqrt(max_length)",
      minimum=1,
      allow_none=True,
    ),
    registry.Option('factor_rank', 8, int, "'factorized_random': rank k", minimum=1),
    registry.Option('seed', 0, int, 'seed of the fixed random matrices', minimum=0),
    SCALE,
  )
  causal = True
  fixed_length = True
  complexity = ('O(n^2 d)', 'O(n^2)')
  whole_sequence = 'its synthesised logits are shaped by the whole sequence (max_length)'
  no_segments = 'its synthesised logits are learned per row position, not per document'
  knob = ('kind', KINDS)
  example = {'kind': 'dense'}

  def _all_specs(self, options, heads, head_dim, max_length):
    return param_specs(
      heads=heads,
      head_dim=head_dim,
      max_length=max_length,
      kind=options.kind,
      mix_with_dot=options.mix_with_dot,
      hidden_dim=options.hidden_dim,
      factor_a=options.factor_a,
      factor_rank=options.factor_rank,
    )

  def check(self, options, *, length, max_length, causal):
    self._all_specs(options, 1, 1, max_length)  # factor_a must divide max_length

  def params(self, options, *, heads, head_dim, max_length, causal):
    specs = self._all_specs(options, heads, head_dim, max_length)
    if not options.trainable_random:
      specs = {n: s for n, s in specs.items() if n not in _RANDOM_PARAMS}
    return specs

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    params = dict(params)
    if not options.trainable_random:
      specs = self._all_specs(options, q.shape[2], q.shape[3], ctx.max_length)
      for i, name in enumerate(n for n in _RANDOM_PARAMS if n in specs):
        key = jax.random.fold_in(feature_maps.fixed_feature_rng(options.seed, ctx.tag), i)
        shape, init = specs[name]
        params[name] = init(key, shape, jnp.float32)
    return synthesizer_attention(
      q,
      k,
      v,
      params,
      mask=mask,
      causal=causal,
      kind=options.kind,
      mix_with_dot=options.mix_with_dot,
      trainable_random=options.trainable_random,
      scale=options.scale,
    )

"""The declarations of the random-feature mechanisms, RFA and Performer.

Their pure functions are `efficient_attn.mechanisms.rfa` (`rfa_attention`, trigonometric
features) and `efficient_attn.mechanisms.performer` (`performer_attention`, FAVOR+); both
run the shared kernel core `efficient_attn.ops.linear_attention`. The two declarations
live here, in one module, because they share their random projection and its options,
and because the registry orders mechanisms by module: 'rfa' before 'performer'.

Redraw policy (both mechanisms): by default the projection is FIXED per
layer, drawn from `feature_maps.fixed_feature_rng(seed, layer tag)`, i.e.
`PRNGKey(seed)` folded with zlib.crc32 of the layer's module path: no variable
collection, no state, and checkpoints restore exactly. With `redraw=True`, a
call with `deterministic=False` and an rng stream named 'features'
(`rngs={'features': key}`) draws a fresh projection; evaluation
(`deterministic=True`) always uses the fixed draw.
"""

import math

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms.kernel_family import CHUNK_SIZE
from efficient_attn.mechanisms.kernel_family import KernelMechanism
from efficient_attn.mechanisms.kernel_family import segment_ids_of
from efficient_attn.mechanisms.performer import performer_attention
from efficient_attn.mechanisms.performer import performer_attention_step
from efficient_attn.mechanisms.rfa import rfa_attention
from efficient_attn.mechanisms.rfa import rfa_attention_step
from efficient_attn.ops import feature_maps
from efficient_attn.ops.scaled_dot_product import softmax_attention

_FEATURE_OPTIONS = (
  registry.Option('orthogonal', True, bool, 'block-orthogonal projection rows'),
  registry.Option('redraw', False, bool, "fresh features in training calls given a 'features' rng"),
  registry.Option('seed', 0, int, 'seed of the fixed per-layer draw', minimum=0),
  CHUNK_SIZE,
)
_FEATURE_KNOB = ('num_features', (16, 32, 64, 128, 256, 512, 1024))


def _projection(options, head_dim: int, ctx):
  """The random projection `[num_features, head_dim]`: fresh (redraw) or the layer's fixed one."""
  key = ctx.rng('features') if options.redraw and not ctx.deterministic else None
  if key is not None:
    return lax.stop_gradient(
      feature_maps.gaussian_projection(
        key, options.num_features, head_dim, orthogonal=options.orthogonal
      )
    )
  # A compile-time constant, cached per layer.
  return feature_maps.fixed_projection(
    options.seed, ctx.tag, options.num_features, head_dim, options.orthogonal
  )


@registry.register
class RFA(KernelMechanism):
  """Learned parameters: 'gate_kernel' `[head_dim, heads]` and 'gate_bias' `[heads]`
  with `use_gate` (g_t = sigmoid(k_t . w_h + b_h)), 'log_sigma' `[heads]` with
  `learn_sigma`."""

  name = 'rfa'
  description = 'random feature attention, trigonometric features'
  citation = 'Peng et al. 2021'
  options = (
    registry.Option('num_features', 64, int, 'D random projections (2 D features)', minimum=1),
    registry.Option('sigma', 1.0, float, 'kernel width (initial value when learned)', above=0.0),
    registry.Option('learn_sigma', False, bool, 'learn log sigma per head'),
    registry.Option('use_gate', False, bool, 'RFA-Gate recency gate (causal only)'),
    registry.Option('gate_bias_init', 0.0, float, 'initial gate bias (larger: longer memory)'),
    registry.Option('eps', 1e-6, float, 'denominator clamp (|den| >= eps, sign kept)', above=0.0),
  ) + _FEATURE_OPTIONS
  random_features = True
  complexity = ('O(n D d)', 'O(n D + D d)')
  knob = _FEATURE_KNOB
  example = {'num_features': 16}

  def check(self, options, *, length, max_length, causal):
    if options.use_gate and not causal:
      raise ValueError(
        'option use_gate=True of mechanism \'rfa\' needs causal=True (the '
        'gate discounts earlier tokens of a prefix)'
      )

  def params(self, options, *, heads, head_dim, max_length, causal):
    out = {}
    if options.use_gate:
      out['gate_kernel'] = registry.ParamSpec((head_dim, heads), jax.nn.initializers.lecun_normal())
      out['gate_bias'] = registry.ParamSpec(
        (heads,), jax.nn.initializers.constant(options.gate_bias_init)
      )
    if options.learn_sigma:
      out['log_sigma'] = registry.ParamSpec(
        (heads,), jax.nn.initializers.constant(math.log(options.sigma))
      )
    return out

  def _gate_sigma(self, options, params, k):
    gate = None
    if options.use_gate:
      compute = jnp.promote_types(k.dtype, jnp.float32)
      logits = jnp.einsum(
        '...hd,dh->...h', k.astype(compute), params['gate_kernel'].astype(compute)
      )
      gate = jax.nn.sigmoid(logits + params['gate_bias'].astype(compute))
    sigma = (
      jnp.exp(params['log_sigma'].astype(jnp.float32)) if options.learn_sigma else options.sigma
    )
    return gate, sigma

  def reference(self, options, q, k, v):
    """Softmax over cosine similarities q^ . k^ / sigma^2 (what the features estimate)."""
    unit = lambda x: x * lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-12)
    return softmax_attention(unit(q), unit(k), v, scale=1.0 / options.sigma**2)

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    gate, sigma = self._gate_sigma(options, params, k)
    return rfa_attention(
      q,
      k,
      v,
      _projection(options, q.shape[-1], ctx),
      mask=mask,
      causal=causal,
      eps=options.eps,
      gate=gate,
      sigma=sigma,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
      segment_ids=segment_ids_of(ctx),
    )

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    gate, sigma = self._gate_sigma(options, params, k)
    return rfa_attention(
      q,
      k,
      v,
      _projection(options, q.shape[-1], ctx),
      mask=mask,
      causal=causal,
      eps=options.eps,
      gate=gate,
      sigma=sigma,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
      segment_ids=segment_ids_of(ctx),
      sequence_axis=axis,
    )

  def feature_dim(self, options, head_dim):
    return 2 * options.num_features  # cos and sin of D projections

  def grouped_state(self, options):
    return not (options.use_gate or options.learn_sigma)  # per-query-head gate or sigma

  def token_step(self, options, params, state, q_t, k_t, v_t, *, ctx, key_valid):
    gate, sigma = self._gate_sigma(options, params, k_t)
    return rfa_attention_step(
      state,
      q_t,
      k_t,
      v_t,
      _projection(options, q_t.shape[-1], ctx),
      sigma=sigma,
      eps=options.eps,
      gate_t=gate,
      key_valid=key_valid,
      position=ctx.position,
    )


@registry.register
class Performer(KernelMechanism):
  name = 'performer'
  description = 'FAVOR+ with positive orthogonal random features'
  citation = 'Choromanski et al. 2021'
  options = (
    registry.Option('num_features', 64, int, 'm positive random features', minimum=1),
    registry.Option(
      'eps',
      None,
      float,
      'denominator clamp; None: tiny^(1/4) of the compute dtype',
      above=0.0,
      allow_none=True,
    ),
  ) + _FEATURE_OPTIONS
  random_features = True
  complexity = ('O(n m d)', 'O(n m + m d)')
  knob = _FEATURE_KNOB
  example = {'num_features': 16}
  # performer_attention takes segment_ids (a key stabiliser per document), but its parallel
  # form and its decoding (a running stabiliser) can disagree where a document's first keys
  # are far below its largest: their denominators fall under eps (tests/layers/test_prefill).
  segments = False
  no_segments = (
    "its parallel form's key stabiliser spans a whole document, so decoding a packed "
    'row can disagree with it at a document\'s first tokens'
  )

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    return performer_attention(
      q,
      k,
      v,
      _projection(options, q.shape[-1], ctx),
      mask=mask,
      causal=causal,
      eps=options.eps,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
      segment_ids=segment_ids_of(ctx),
    )

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    return performer_attention(
      q,
      k,
      v,
      _projection(options, q.shape[-1], ctx),
      mask=mask,
      causal=causal,
      eps=options.eps,
      chunk_size=options.chunk_size,
      positions=ctx.positions,
      segment_ids=segment_ids_of(ctx),
      sequence_axis=axis,
    )

  def feature_dim(self, options, head_dim):
    return options.num_features

  def grouped_state(self, options):
    return True  # one random projection for every head

  def token_step(self, options, params, state, q_t, k_t, v_t, *, ctx, key_valid):
    return performer_attention_step(
      state,
      q_t,
      k_t,
      v_t,
      _projection(options, q_t.shape[-1], ctx),
      eps=options.eps,
      key_valid=key_valid,
      position=ctx.position,
    )

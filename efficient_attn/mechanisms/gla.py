"""Gated linear attention (Yang et al. 2024, "Gated Linear Attention Transformers with
Hardware-Efficient Training"): a data-dependent decay per key feature.

    S_t = diag(a_t) S_{t-1} + k_t v_t^T,    o_t = S_t^T q_t / sqrt(dk),
    a_t = sigmoid(x_t W_1 W_2 + b)^(1 / tau)      (low rank 16, tau = 16),

so log a_t = log_sigmoid(x_t W_1 W_2 + b) / tau, computed in float32. The
output is the paper's per-head RMSNorm of o times the swish gate of the token:
out_t = RMSNorm(o_t) * swish(x_t W_r), before the layer's W_O. The gate
projections start as the paper's release of flash-linear-attention initialised
GLA (Xavier uniform with gain 2^-2.5, zero bias; fla's GLA layer until March
2025, which then dropped it for its model-wide N(0, 0.02)). `init='fla'` gives
today's fla initialisation, N(0, 0.02) for every gate projection (zero bias).

The chunkwise form is `efficient_attn.ops.gated.gated_chunked` with a per-feature decay: its
intra-chunk factors exp(b_t - b_s) are formed per feature, masked first, so they
stay <= 1 however strong the decay.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import gated_family
from efficient_attn.mechanisms import initializers
from efficient_attn.ops import gated
from efficient_attn.ops import norm
from efficient_attn.ops.gated import documents


def gla_attention(
  q,
  k,
  v,
  log_decay,
  mask=None,
  *,
  form: str = 'chunk',
  chunk_size: int = 64,
  segment_ids=None,
  initial_state=None,
  return_final_state: bool = False,
):
  """GLA's recurrence: S_t = diag(exp(log_decay_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t / sqrt(dk).

  The mechanism's recurrence alone (causal); its gates come from the layer's projections
  (log_decay = log_sigmoid(x W_1 W_2 + b) / 16), and its output norm and swish gate
  are not applied.

  Args:
    q, k: `[batch, length, heads, dk]`; v: `[batch, length, heads, dv]`.
    log_decay: log a_t <= 0, `[batch, length, heads, dk]` (one per key feature, GLA's) or
      `[batch, length, heads, 1]` (one per head).
    mask: optional key padding `[batch, length]` (or a flax-style mask, reduced to
      one): a padded token neither writes to the state nor decays it (its output is 0).
    form: 'chunk' (chunkwise parallel) or 'naive' (token by token, the definition).
    chunk_size: tokens per chunk of the chunkwise form.
    segment_ids, initial_state, return_final_state: packed rows (0 is padding) and the
      state S `[batch, heads, dk, dv]` in and out, as `gated_family.pure_recurrence` says.

  Returns:
    `[batch, length, heads, dv]` in v's dtype (computed in float32, or float64 where the
    inputs are), and with return_final_state the final state `[batch, heads, dk, dv]`.
  """
  b, n, h, dk = q.shape
  call = gated_family.checked_call(
    'gla',
    'gla_attention',
    q,
    k,
    v,
    mask,
    {'log_decay': (log_decay, ((b, n, h, dk), (b, n, h, 1)))},
    form=form,
    chunk_size=chunk_size,
    segment_ids=segment_ids,
    initial_state=initial_state,
  )
  q, k, v, log_decay = documents.zero_padding(call.real, q, k, v, jnp.asarray(log_decay))
  out, state = gated_family.pure_recurrence(
    gated.DECAY,
    gated_family.upcast(q) / math.sqrt(dk),
    k,
    v,
    gated_family.upcast(log_decay),
    call=call,
    form=form,
    chunk_size=chunk_size,
    initial_state=initial_state,
  )
  return gated_family.finished(out, state, v.dtype, return_final_state)


@registry.register
class GLA(gated_family.GatedRecurrence):
  name = 'gla'
  description = 'gated linear attention: a data-dependent decay per key feature'
  citation = 'Yang et al. 2024'
  options = gated_family.common_options(
    conv_size=0, default_init='Xavier uniform, gain 2^-2.5: fla until March 2025'
  ) + (
    registry.Option('gate_rank', 16, int, 'rank of the decay projection W_1 W_2', minimum=1),
    registry.Option('gate_normalizer', 16.0, float, 'tau: log a = log_sigmoid(.) / tau', above=0.0),
  )
  complexity = ('O(n c d + n d^2)', 'O(n d + c^2 d + d^2)')
  example = {'chunk_size': 4, 'gate_rank': 4}

  def own_params(self, options, *, heads, head_dim):
    return {'norm_scale': registry.ParamSpec((head_dim,), initializers.ones_init)}

  def input_params(self, options, *, features, heads, head_dim):
    init = self.init_for(options, initializers.gla_xavier_init)
    return {
      'decay_down': registry.ParamSpec((features, options.gate_rank), init),
      'decay_up': registry.ParamSpec((options.gate_rank, heads, head_dim), init),
      'decay_bias': registry.ParamSpec((heads, head_dim), nn.initializers.zeros_init()),
      'gate_kernel': registry.ParamSpec((features, heads, head_dim), init),
    }

  def gates(self, options, params, inputs):
    logits = gated_family.dense(
      gated_family.dense(inputs, params['decay_down']), params['decay_up'], params['decay_bias']
    )
    return {
      'log_decay': jax.nn.log_sigmoid(logits) / options.gate_normalizer,
      'output': gated_family.dense(inputs, params['gate_kernel']),
    }

  def recurrence_inputs(self, options, params, q, k, v, gates):
    return q / math.sqrt(q.shape[-1]), k, v, gates['log_decay'], None

  def finish(self, options, params, out, v, gates):
    return norm.rms_norm(out, params['norm_scale']) * nn.swish(gates['output'])

  def run_pure_function(self, q, k, v, gates, params, **kwargs):
    del params
    return gla_attention(q, k, v, gates['log_decay'], **kwargs)

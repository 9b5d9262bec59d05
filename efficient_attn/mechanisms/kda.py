"""Kimi Delta Attention (Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention
Architecture"): the gated delta rule with a decay per key feature.

    S_t = (I - beta_t k_t k_t^T) diag(a_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t / sqrt(dk),
    log a_t = -exp(A_log) softplus(x_t W_down W_up + dt_bias)   (one per head and key feature),
    beta_t = sigmoid(x_t W_beta),

Gated DeltaNet's write with GLA's fine-grained decay, as flash-linear-attention's
KimiDeltaAttention layer (and its `naive_recurrent_kda`): q, k, v through the short causal
convolution (kernel 4) and SiLU, q and k L2-normalised; the decay from a low-rank
projection (rank head_dim) through softplus with A_log `[heads]` and dt_bias
`[heads, head_dim]`; the output is RMSNorm(o_t) * sigmoid(x_t G_down G_up + g_bias) (fla's
FusedRMSNormGated with a sigmoid, its gate a low-rank projection of rank head_dim with a
bias). Initialisation as fla's model: A uniform in [1, 16], dt log-uniform in [dt_min, dt_max]
= [0.001, 0.1] through dt_bias, every projection and the convolution N(0, 0.02), the gate's
bias 0 (`init='fla'`, the default); `init='default'` gives PyTorch's module defaults.
Not here: fla's options allow_neg_eigval (beta in (0, 2)), lower_bound (a clamped gate) and
grouped value heads.

The chunkwise form is `efficient_attn.ops.delta.delta_chunked` with log-decays `[b, n, h,
dk]` (the WY form with per-feature decayed scores, every factor <= 1); implementation='pallas'
runs the Pallas kernel `efficient_attn.ops.kernels.delta_chunked`, per-feature path.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import deltanet
from efficient_attn.mechanisms import gated_family
from efficient_attn.mechanisms import initializers
from efficient_attn.ops import delta
from efficient_attn.ops import norm
from efficient_attn.ops.gated import documents


def kda_attention(
  q,
  k,
  v,
  beta,
  log_decay,
  mask=None,
  *,
  form: str = 'chunk',
  chunk_size: int = 64,
  segment_ids=None,
  initial_state=None,
  return_final_state: bool = False,
):
  """Kimi Delta Attention's recurrence:
  S_t = (I - beta_t k_t k_t^T) diag(exp(log_decay_t)) S_{t-1} + beta_t k_t v_t^T,
  o_t = S_t^T q_t / sqrt(dk), with q and k L2-normalised.

  The mechanism's recurrence alone (causal), on q, k, v as it reads them (after the layer's
  short convolution and SiLU); beta and the decays come from the layer's projections, and
  the output norm and gate are not applied.

  Args:
    q, k: `[batch, length, heads, dk]`; v: `[batch, length, heads, dv]`.
    beta: write strengths in (0, 1), `[batch, length, heads]`.
    log_decay: log a_t <= 0, one per key feature `[batch, length, heads, dk]` (or one per
      head, `[batch, length, heads, 1]`: Gated DeltaNet's).
    mask: optional key padding `[batch, length]` (or a flax-style mask, reduced to
      one): a padded token neither writes to the state nor decays it (its output is 0).
    form: 'chunk' (chunkwise parallel, the WY form) or 'naive' (token by token, the
      definition).
    chunk_size: tokens per chunk of the chunkwise form.
    segment_ids, initial_state, return_final_state: packed rows (0 is padding) and the
      state S `[batch, heads, dk, dv]` in and out, as `gated_family.pure_recurrence` says.

  Returns:
    `[batch, length, heads, dv]` in v's dtype (computed in float32, or float64 where the
    inputs are), and with return_final_state the final state `[batch, heads, dk, dv]`.
  """
  b, n, h, dk = q.shape
  call = gated_family.checked_call(
    'kda',
    'kda_attention',
    q,
    k,
    v,
    mask,
    {
      'beta': (beta, ((b, n, h),)),
      'log_decay': (log_decay, ((b, n, h, dk), (b, n, h, 1))),
    },
    form=form,
    chunk_size=chunk_size,
    segment_ids=segment_ids,
    initial_state=initial_state,
  )
  q, k, v, beta, log_decay = documents.zero_padding(
    call.real, q, k, v, jnp.asarray(beta), jnp.asarray(log_decay)
  )
  out, state = gated_family.pure_recurrence(
    delta.DELTA,
    norm.l2_normalize(q) / math.sqrt(dk),
    norm.l2_normalize(k),
    v,
    gated_family.upcast(log_decay),
    gated_family.upcast(beta),
    call=call,
    form=form,
    chunk_size=chunk_size,
    initial_state=initial_state,
  )
  return gated_family.finished(out, state, v.dtype, return_final_state)


@registry.register
class KDA(deltanet.DeltaNet):
  """DeltaNet's declaration with a per-feature decay before the write and a sigmoid
  output gate (Kimi Linear's KDA layer)."""

  name = 'kda'
  description = 'Kimi Delta Attention: a decay per key feature, then the delta write (WY chunks)'
  citation = 'Kimi Team 2025'
  options = (
    tuple(
      dataclasses.replace(options, default='fla') if options.name == 'init' else options
      for options in deltanet.DeltaNet.options
    )
    + gated_family.decay_options()
  )
  complexity = ('O(n c d + n d^2)', 'O(n d + c^2 d + d^2)')

  def check_options(self, options):
    gated_family.check_dt_range(self.name, options)

  def own_params(self, options, *, heads, head_dim):
    return {
      'A_log': registry.ParamSpec((heads,), initializers.a_log_init(1.0, 16.0)),
      'dt_bias': registry.ParamSpec((heads, head_dim), gated_family.dt_init(options)),
      **super().own_params(options, heads=heads, head_dim=head_dim),
    }

  def input_params(self, options, *, features, heads, head_dim):
    init = self.init_for(options, initializers.torch_linear_init)
    # PyTorch's nn.Linear bias: U(+-1/sqrt(fan_in)), the distribution of conv_bias_init.
    bias = (
      initializers.zeros_init if options.init == 'fla' else initializers.conv_bias_init(head_dim)
    )
    return {
      **super().input_params(options, features=features, heads=heads, head_dim=head_dim),
      'decay_down': registry.ParamSpec((features, head_dim), init),
      'decay_up': registry.ParamSpec((head_dim, heads, head_dim), init),
      'gate_down': registry.ParamSpec((features, head_dim), init),
      'gate_up': registry.ParamSpec((head_dim, heads, head_dim), init),
      'gate_bias': registry.ParamSpec((heads, head_dim), bias),
    }

  def gates(self, options, params, inputs):
    low_rank = lambda down, up, bias=None: gated_family.dense(
      gated_family.dense(inputs, params[down]), params[up], None if bias is None else params[bias]
    )
    dt = jax.nn.softplus(low_rank('decay_down', 'decay_up', 'dt_bias'))  # [b, n, h, dk]
    a = jnp.exp(gated_family.upcast(params['A_log']))[:, None]
    return {
      **super().gates(options, params, inputs),
      'log_decay': -a * dt,
      'output': low_rank('gate_down', 'gate_up', 'gate_bias'),
    }

  def recurrence_inputs(self, options, params, q, k, v, gates):
    q, k, v, _, beta = super().recurrence_inputs(options, params, q, k, v, gates)
    return q, k, v, gates['log_decay'], beta

  def finish(self, options, params, out, v, gates):
    return super().finish(options, params, out, v, gates) * jax.nn.sigmoid(gates['output'])

  def run_pure_function(self, q, k, v, gates, params, **kwargs):
    del params
    return kda_attention(q, k, v, gates['beta'], gates['log_decay'], **kwargs)

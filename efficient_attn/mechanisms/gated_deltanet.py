"""Gated DeltaNet: the gated delta rule (Yang, Kautz & Hatamizadeh 2025).

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t / sqrt(dk),
    a_t = exp(-exp(A_log) softplus(x_t W_a + dt_bias)),   beta_t = sigmoid(x_t W_beta),

per head from the token (Mamba-2's decay with the delta rule's write), q, k, v
through the short causal convolution (kernel 4) and SiLU, q and k
L2-normalised; the output is RMSNorm(o_t) * swish(x_t W_g), as
flash-linear-attention's GatedDeltaNet, which also gives the decay's
initialisation (A uniform in [0, 16], dt log-uniform in [dt_min, dt_max] =
[0.001, 0.1] through dt_bias). The convolution and gate projections start as fla's
model initialises them, N(0, 0.02) (`init='fla'`, the default); `init='default'` gives
PyTorch's module defaults, DeltaNet's default. With PyTorch's, Gated DeltaNet stayed near
chance on the recall study's width-64 cell where fla's solves it (studies/recall).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import deltanet
from efficient_attn.mechanisms import gated_family
from efficient_attn.mechanisms import initializers

# Its pure function is the delta rule's, with log_decay (`deltanet.delta_rule_attention`).
gated_deltanet_attention = deltanet.delta_rule_attention


@registry.register
class GatedDeltaNet(deltanet.DeltaNet):
  """DeltaNet's declaration with Mamba-2's decay before the write and an output gate."""

  name = 'gated_deltanet'
  description = 'the gated delta rule: a decay per head, then the delta write (WY chunks)'
  citation = 'Yang, Kautz & Hatamizadeh 2025'

  options = (
    tuple(
      dataclasses.replace(options, default='fla') if options.name == 'init' else options
      for options in deltanet.DeltaNet.options
    )
    + gated_family.decay_options()
  )

  def check_options(self, options):
    gated_family.check_dt_range(self.name, options)

  def own_params(self, options, *, heads, head_dim):
    return {
      'A_log': registry.ParamSpec((heads,), initializers.a_log_init(0.0, 16.0)),
      'dt_bias': registry.ParamSpec((heads,), gated_family.dt_init(options)),
      **super().own_params(options, heads=heads, head_dim=head_dim),
    }

  def input_params(self, options, *, features, heads, head_dim):
    init = self.init_for(options, initializers.torch_linear_init)
    return {
      **super().input_params(options, features=features, heads=heads, head_dim=head_dim),
      'decay_kernel': registry.ParamSpec((features, heads), init),
      'gate_kernel': registry.ParamSpec((features, heads, head_dim), init),
    }

  def gates(self, options, params, inputs):
    dt = jax.nn.softplus(gated_family.dense(inputs, params['decay_kernel'], params['dt_bias']))
    return {
      **super().gates(options, params, inputs),
      'log_decay': -jnp.exp(gated_family.upcast(params['A_log'])) * dt,
      'output': gated_family.dense(inputs, params['gate_kernel']),
    }

  def recurrence_inputs(self, options, params, q, k, v, gates):
    q, k, v, _, beta = super().recurrence_inputs(options, params, q, k, v, gates)
    return q, k, v, gates['log_decay'][..., None], beta

  def finish(self, options, params, out, v, gates):
    return super().finish(options, params, out, v, gates) * nn.swish(gates['output'])

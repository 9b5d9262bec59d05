"""Gated DeltaNet: the gated delta rule (Yang, Kautz & Hatamizadeh 2025).

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t / sqrt(dk),
    a_t = exp(-exp(A_log) softplus(x_t W_a + dt_bias)),   beta_t = sigmoid(x_t W_beta),

per head from the token (Mamba-2's decay with the delta rule's write), q, k, v
through the short causal convolution (kernel 4) and SiLU, q and k
L2-normalised; the output is RMSNorm(o_t) * swish(x_t W_g), as
flash-linear-attention's GatedDeltaNet, which also gives the initialisation
(A uniform in [0, 16], dt log-uniform in [0.001, 0.1] through dt_bias).
"""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from efficient_attn import delta_rule
from efficient_attn import gated_linear
from efficient_attn import registry

linear_init = gated_linear.torch_linear_init


@registry.register
class GatedDeltaNet(gated_linear.GatedRecurrence):
  name = 'gated_deltanet'
  description = 'the gated delta rule: a decay per head, then the delta write (WY chunks)'
  citation = 'Yang, Kautz & Hatamizadeh 2025'
  options = gated_linear.common_options(conv_size=4)
  activation = 'silu'
  cores = delta_rule.DELTA
  complexity = ('O(n c d + n d^2)', 'O(n d + c^2 + d^2)')
  example = {'chunk_size': 4}

  def own_params(self, o, *, heads, head_dim):
    return {
        'A_log': registry.ParamSpec((heads,), gated_linear.a_log_init(0.0, 16.0)),
        'dt_bias': registry.ParamSpec((heads,), gated_linear.dt_bias_init),
        'norm_scale': registry.ParamSpec((head_dim,), gated_linear.ones_init),
    }

  def input_params(self, o, *, features, heads, head_dim):
    return {'beta_kernel': registry.ParamSpec((features, heads), linear_init),
            'decay_kernel': registry.ParamSpec((features, heads), linear_init),
            'gate_kernel': registry.ParamSpec((features, heads, head_dim), linear_init)}

  def gates(self, o, params, inputs):
    dt = jax.nn.softplus(gated_linear.dense(inputs, params['decay_kernel'], params['dt_bias']))
    return {'beta': jax.nn.sigmoid(gated_linear.dense(inputs, params['beta_kernel'])),
            'log_decay': -jnp.exp(params['A_log'].astype(jnp.float32)) * dt,
            'output': gated_linear.dense(inputs, params['gate_kernel'])}

  def recurrence_inputs(self, o, params, q, k, v, gates):
    q = delta_rule.l2_normalize(q) / math.sqrt(q.shape[-1])
    return q, delta_rule.l2_normalize(k), v, gates['log_decay'][..., None], gates['beta']

  def finish(self, o, params, out, v, gates):
    return gated_linear.rms_norm(out, params['norm_scale']) * nn.swish(gates['output'])

"""Mamba-2's state space duality layer (Dao & Gu 2024, "Transformers are SSMs"): a scalar
data-dependent decay per head.

With the layer's queries as C, keys as B and values as X,

    dt_t = softplus(x_t W_dt + dt_bias),   a_t = exp(-exp(A_log) dt_t)     (per head),
    S_t = a_t S_{t-1} + dt_t B_t X_t^T,    y_t = S_t^T C_t + D X_t,

after the short causal convolution (kernel 4) and SiLU on C, B and X, as Mamba-2.
The output is the gated RMSNorm over the full width, norm(y * silu(z_t)) with
z_t = x_t W_z, before the layer's out projection. Initialisation as Mamba-2:
A uniform in [1, 16], dt log-uniform in [0.001, 0.1] through dt_bias, D = 1.

Deviation from the paper's layout: here every head has its own B and C (the
layer's per-head query and key projections, state size d_state = head_dim). The
paper's default (mamba_ssm's Mamba2, ngroups=1) projects one B and one C of
d_state (128) features that every head shares, the multi-value head pattern the
paper argues for (only X, dt and the decay are per head). Per-head B and C is its
ngroups = heads setting: more parameters in the q and k projections, the same recurrence and
state shape per head. The layer's `num_kv_heads` shares keys and values, not
queries and keys, so it does not give the paper's layout.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from efficient_attn import gated_linear
from efficient_attn import registry

linear_init = gated_linear.torch_linear_init


@registry.register
class Mamba2(gated_linear.GatedRecurrence):
  name = 'mamba2'
  description = "Mamba-2's SSD: a data-dependent scalar decay per head (A, dt)"
  citation = 'Dao & Gu 2024'
  options = gated_linear.common_options(conv_size=4)
  activation = 'silu'
  complexity = ('O(n c d + n d^2)', 'O(n d + d^2)')
  example = {'chunk_size': 4}

  def own_params(self, o, *, heads, head_dim):
    return {
        'A_log': registry.ParamSpec((heads,), gated_linear.a_log_init(1.0, 16.0)),
        'dt_bias': registry.ParamSpec((heads,), gated_linear.dt_bias_init),
        'D': registry.ParamSpec((heads,), gated_linear.ones_init),
        'norm_scale': registry.ParamSpec((heads, head_dim), gated_linear.ones_init),
    }

  def input_params(self, o, *, features, heads, head_dim):
    return {'dt_kernel': registry.ParamSpec((features, heads), linear_init),
            'gate_kernel': registry.ParamSpec((features, heads, head_dim), linear_init)}

  def gates(self, o, params, inputs):
    dt = jax.nn.softplus(gated_linear.dense(inputs, params['dt_kernel'], params['dt_bias']))
    return {'dt': dt, 'output': gated_linear.dense(inputs, params['gate_kernel'])}

  def recurrence_inputs(self, o, params, q, k, v, gates):
    dt = gates['dt'][..., None]                                    # [b, n, h, 1]
    log_decay = -jnp.exp(params['A_log'].astype(jnp.float32))[:, None] * dt
    return q, gated_linear.rows(k, dt), v, log_decay, None

  def finish(self, o, params, out, v, gates):
    y = out + params['D'].astype(jnp.float32)[:, None] * v
    return gated_linear.rms_norm(y * nn.swish(gates['output']), params['norm_scale'],
                                 axes=(-2, -1))

"""Retention (Sun et al. 2023, "Retentive Network"): linear attention with a fixed decay per head.

Multi-scale retention gives head h the decay gamma_h = 1 - 2^(-5 - h):

    S_t = gamma_h S_{t-1} + k_t v_t^T,     o_t = S_t^T q_t,     k scaled by 1/sqrt(dk),

then a per-head normalisation of o (RetNet's GroupNorm, as an RMSNorm without
affine parameters) and the swish gate of the token: out_t = swish(x_t W_G) *
norm(o_t), before the layer's output projection W_O. RetNet's rotation of q
and k (its xPos-style relative positions) is the layer's rotary=True.

The recurrence and its chunkwise form are `efficient_attn.ops.gated`'s
(a scalar log-decay per head); decoding keeps the constant-size state S.

Value width. RetNet's values and gate are twice as wide as its queries and keys
(W_V, W_G `[d, 2d]`, W_O `[2d, d]`; per head d_v = 2 d_k): `value_factor=2` builds
that layer (value projection and gate `[d, heads, 2 head_dim]`, out projection
`[heads, 2 head_dim, d]`, state `[d_k, 2 d_k]`), with projection 'standard' (the
other schemes slice values into heads of head_dim, so the layers refuse them).
The default, value_factor=1 (d_v = d_k: a state half the paper's at the same
d_k), keeps the width every mechanism has, which every projection scheme
builds. The norm is RetNet's (no learned scale; flash-linear-attention's
MultiScaleRetention doubles the values too but learns a scale).
"""

import math

import flax.linen as nn
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import gated_family
from efficient_attn.ops import gated
from efficient_attn.ops import norm


def retention_log_decay(heads: int, dtype=jnp.float32):
  """log gamma_h = log(1 - 2^(-5 - h)) for h = 0..heads-1, `[heads]` (float32)."""
  return jnp.log1p(-jnp.exp2(-5.0 - jnp.arange(heads, dtype=dtype)))


def retention_attention(
  q,
  k,
  v,
  mask=None,
  *,
  form: str = 'chunk',
  chunk_size: int = 64,
  segment_ids=None,
  initial_state=None,
  return_final_state: bool = False,
):
  """Retention's recurrence: S_t = gamma_h S_{t-1} + (k_t / sqrt(dk)) v_t^T, o_t = S_t^T q_t.

  The mechanism's recurrence alone (causal), gamma_h = 1 - 2^(-5 - h) for head h
  (`retention_log_decay`); the layer's output norm and swish gate are not applied.

  Args:
    q, k: `[batch, length, heads, dk]`; v: `[batch, length, heads, dv]`.
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
  call = gated_family.checked_call(
    'retention',
    'retention_attention',
    q,
    k,
    v,
    mask,
    {},
    form=form,
    chunk_size=chunk_size,
    segment_ids=segment_ids,
    initial_state=initial_state,
  )
  b, n, h, dk = k.shape
  k = gated_family.upcast(k) / math.sqrt(dk)
  g = retention_log_decay(h, k.dtype)[:, None]
  out, state = gated_family.pure_recurrence(
    gated.DECAY,
    q,
    k,
    v,
    jnp.broadcast_to(g, (b, n, h, 1)),
    call=call,
    form=form,
    chunk_size=chunk_size,
    initial_state=initial_state,
  )
  return gated_family.finished(out, state, v.dtype, return_final_state)


@registry.register
class Retention(gated_family.GatedRecurrence):
  name = 'retention'
  description = 'retention: a fixed decay per head, group norm and a swish gate'
  citation = 'Sun et al. 2023'
  options = gated_family.common_options(conv_size=0, default_init='LeCun normal') + (
    registry.Option(
      'value_factor',
      1,
      int,
      'values, swish gate and norm are value_factor x head_dim wide (RetNet: 2)',
      minimum=1,
    ),
  )
  rotary = 'scores'
  complexity = ('O(n c d + n d^2)', 'O(n d + d^2)')
  example = {'chunk_size': 4}

  def head_shapes(self, options, *, heads, head_dim):
    return heads, head_dim, options.value_factor * head_dim

  def input_params(self, options, *, features, heads, head_dim):
    return {
      'gate_kernel': registry.ParamSpec(
        (features, heads, options.value_factor * head_dim),
        self.init_for(options, nn.initializers.lecun_normal()),
      )
    }

  def gates(self, options, params, inputs):
    return {'output': gated_family.dense(inputs, params['gate_kernel'])}

  def recurrence_inputs(self, options, params, q, k, v, gates):
    b, n, h, dk = k.shape
    g = jnp.broadcast_to(retention_log_decay(h, k.dtype)[:, None], (b, n, h, 1))
    return q, k / math.sqrt(dk), v, g, None

  def finish(self, options, params, out, v, gates):
    return norm.rms_norm(out) * nn.swish(gates['output'])

  def run_pure_function(self, q, k, v, gates, params, **kwargs):
    del gates, params  # its decays are fixed
    return retention_attention(q, k, v, **kwargs)

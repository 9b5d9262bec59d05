"""DeltaNet: the delta rule (Schlag et al. 2021), trained chunkwise in parallel (Yang et al. 2024).

    S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t / sqrt(dk),

with beta_t = sigmoid(x_t W_beta) per head from the token, and q, k, v through the
short causal convolution (kernel 4) and SiLU, q and k L2-normalised, as
flash-linear-attention's DeltaNet; the output is the per-head RMSNorm of o.
Initialisation: PyTorch's module defaults (convolution U(+-1/sqrt(4)), beta projection
U with variance 1/(3 fan_in)); `init='fla'` gives fla's model initialisation, N(0, 0.02)
for both (its whole model is re-initialised so; the layer's q/k/v/o projections
keep the layer's own `kernel_init`). The
chunkwise form is `efficient_attn.ops.delta.delta_chunked`, the WY representation (UT
transform) of Yang et al. 2024.
"""

import math

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import gated_family
from efficient_attn.mechanisms import initializers
from efficient_attn.ops import delta
from efficient_attn.ops import norm
from efficient_attn.ops.gated import documents


def delta_rule_attention(
  q,
  k,
  v,
  beta,
  log_decay=None,
  mask=None,
  *,
  form: str = 'chunk',
  chunk_size: int = 64,
  segment_ids=None,
  initial_state=None,
  return_final_state: bool = False,
):
  """The (gated) delta rule of DeltaNet and Gated DeltaNet:
  S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t / sqrt(dk),
  with q and k L2-normalised and a_t = exp(log_decay_t) (1 without log_decay: DeltaNet).
  Also `deltanet_attention` and `gated_deltanet_attention` (the same function).

  The mechanisms' recurrence alone (causal), on q, k, v as they read them (after the
  layer's short convolution and SiLU); beta (and Gated DeltaNet's decay) come from the
  layer's projections, and the output norm (and gate) are not applied.

  Args:
    q, k: `[batch, length, heads, dk]`; v: `[batch, length, heads, dv]`.
    beta: write strengths in (0, 1), `[batch, length, heads]`.
    log_decay: optional log a_t <= 0, `[batch, length, heads]` (Gated DeltaNet).
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
    'deltanet',
    'delta_rule_attention',
    q,
    k,
    v,
    mask,
    {'beta': (beta, ((b, n, h),)), 'log_decay': (log_decay, ((b, n, h),))},
    form=form,
    chunk_size=chunk_size,
    segment_ids=segment_ids,
    initial_state=initial_state,
  )
  q, k, v, beta = documents.zero_padding(call.real, q, k, v, jnp.asarray(beta))
  g = None
  if log_decay is not None:
    (g,) = documents.zero_padding(call.real, gated_family.upcast(log_decay)[..., None])
  out, state = gated_family.pure_recurrence(
    delta.DELTA,
    norm.l2_normalize(q) / math.sqrt(dk),
    norm.l2_normalize(k),
    v,
    g,
    gated_family.upcast(beta),
    call=call,
    form=form,
    chunk_size=chunk_size,
    initial_state=initial_state,
  )
  return gated_family.finished(out, state, v.dtype, return_final_state)


deltanet_attention = delta_rule_attention  # the `<mechanism>_attention` name


@registry.register
class DeltaNet(gated_family.GatedRecurrence):
  name = 'deltanet'
  description = 'the delta rule: an error-correcting write with a learned beta (WY chunks)'
  citation = 'Schlag et al. 2021'
  options = gated_family.common_options(conv_size=4)
  activation = 'silu'
  cores = delta.DELTA
  sequence_parallel = 'transition'
  sharded_recurrence = staticmethod(delta.transition_sharded)
  complexity = ('O(n c d + n d^2)', 'O(n d + c^2 + d^2)')
  example = {'chunk_size': 4}

  def own_params(self, options, *, heads, head_dim):
    return {'norm_scale': registry.ParamSpec((head_dim,), initializers.ones_init)}

  def input_params(self, options, *, features, heads, head_dim):
    return {
      'beta_kernel': registry.ParamSpec(
        (features, heads), self.init_for(options, initializers.torch_linear_init)
      )
    }

  def gates(self, options, params, inputs):
    return {'beta': jax.nn.sigmoid(gated_family.dense(inputs, params['beta_kernel']))}

  def recurrence_inputs(self, options, params, q, k, v, gates):
    q = norm.l2_normalize(q) / math.sqrt(q.shape[-1])
    return q, norm.l2_normalize(k), v, None, gates['beta']

  def finish(self, options, params, out, v, gates):
    return norm.rms_norm(out, params['norm_scale'])

  def run_pure_function(self, q, k, v, gates, params, **kwargs):
    del params
    return delta_rule_attention(q, k, v, gates['beta'], gates.get('log_decay'), **kwargs)

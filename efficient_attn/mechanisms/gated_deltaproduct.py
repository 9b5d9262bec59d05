"""Gated DeltaProduct (Siems et al. 2025, "DeltaProduct: Improving State-Tracking in Linear
RNNs via Householder Products"): n_h delta-rule steps a token, one decay a token.

    S_{t,0} = a_t S_{t-1},
    S_{t,j} = (I - beta_{t,j} k_{t,j} k_{t,j}^T) S_{t,j-1} + beta_{t,j} k_{t,j} v_{t,j}^T,
    S_t = S_{t,n_h},    o_t = S_t^T q_t / sqrt(dk),    j = 1..n_h,
    a_t = exp(-exp(A_log) softplus(x_t W_a + dt_bias)),
    beta_{t,j} = 2 sigmoid(x_t W_beta,j)  (allow_neg_eigval; sigmoid without),

per head (a token's transition a_t times a product of n_h generalised Householder
matrices), step j taking its own key, value and beta (`efficient_attn.ops.delta.product`:
the delta rule on the n * n_h substeps, the decay before each token's first). n_h = 1 with
allow_neg_eigval=False is Gated DeltaNet exactly, parameters included. As fla's
GatedDeltaProduct layer: num_householder=2 and allow_neg_eigval=True (beta in (0, 2), so
each factor's eigenvalue 1 - beta reaches (-1, 1), what state tracking needs), the n_h
keys (and values) through one short causal convolution (kernel 4) and SiLU, q and k
L2-normalised, the output RMSNorm(o_t) * swish(x_t W_g), the decay and its initialisation
Gated DeltaNet's. The first key and value are the layer's k and v projections; the
further n_h - 1 (and their betas) are this mechanism's own projections of the layer input
(`keys_kernel`, `values_kernel`, `betas_kernel`), initialised as the gate projections
(init='fla', the default: N(0, 0.02), fla's model initialisation).

`chunk_size` counts tokens: the WY chunks (and the Pallas kernels' tiles) hold
chunk_size * n_h substeps; its default, 32, makes them fla's 64 substeps at n_h = 2.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import gated_deltanet
from efficient_attn.mechanisms import gated_family
from efficient_attn.ops import delta
from efficient_attn.ops import norm
from efficient_attn.ops.delta import product
from efficient_attn.ops.gated import documents

CORES = product.householder_cores(delta.DELTA.pallas)
_FUNCTION = 'gated_deltaproduct_attention'
# Tokens a chunk: 64 substeps at n_h = 2, the WY chunk of fla's chunk_gated_delta_product.
CHUNK = 32
CHUNK_DOC = 'tokens per chunk of the chunkwise form (chunk_size * num_householder substeps)'


def gated_deltaproduct_attention(
  q,
  k,
  v,
  beta,
  log_decay=None,
  mask=None,
  *,
  form: str = 'chunk',
  chunk_size: int = CHUNK,
  segment_ids=None,
  initial_state=None,
  return_final_state: bool = False,
):
  """Gated DeltaProduct's recurrence: for each token t, S = a_t S, then for j = 1..n_h
  S = (I - beta_{t,j} k_{t,j} k_{t,j}^T) S + beta_{t,j} k_{t,j} v_{t,j}^T; o_t = S^T q_t /
  sqrt(dk), with q and k L2-normalised and a_t = exp(log_decay_t) (1 without log_decay).

  The mechanism's recurrence alone (causal), on q, k, v as it reads them (after the layer's
  short convolution and SiLU); the output norm and gate are not applied.

  Args:
    q: `[batch, length, heads, dk]`; k: `[batch, length, heads, n_h, dk]`; v: `[batch,
      length, heads, n_h, dv]` (n_h, the Householder steps a token, from k's shape).
    beta: write strengths in (0, 2) (in (0, 1) without negative eigenvalues), `[batch,
      length, heads, n_h]`.
    log_decay: optional log a_t <= 0, `[batch, length, heads]`, one a token.
    mask: optional key padding `[batch, length]` (or a flax-style mask, reduced to one):
      a padded token neither writes to the state nor decays it (its output is 0).
    form: 'chunk' (chunkwise parallel, the WY form on the substeps) or 'naive' (step by
      step, the definition).
    chunk_size: tokens per chunk of the chunkwise form (chunk_size * n_h substeps).
    segment_ids, initial_state, return_final_state: packed rows (0 is padding) and the
      state S `[batch, heads, dk, dv]` in and out, as `gated_family.pure_recurrence` says.

  Returns:
    `[batch, length, heads, dv]` in v's dtype (computed in float32, or float64 where the
    inputs are), and with return_final_state the final state `[batch, heads, dk, dv]`.
  """
  if jnp.ndim(k) != 5 or jnp.ndim(v) != 5:
    raise ValueError(
      f'{_FUNCTION}: k {list(jnp.shape(k))}, v {list(jnp.shape(v))}; valid: k [batch, '
      f'length, heads, num_householder, dk] and v [batch, length, heads, num_householder, dv]'
    )
  b, n, h, dk = q.shape
  n_h = k.shape[3]
  call = gated_family.checked_call(
    'gated_deltaproduct',
    _FUNCTION,
    q,
    k[:, :, :, 0],
    v[:, :, :, 0],
    mask,
    {
      'k': (k, ((b, n, h, n_h, dk),)),
      'v': (v, ((b, n, h, n_h, v.shape[-1]),)),
      'beta': (beta, ((b, n, h, n_h),)),
      'log_decay': (log_decay, ((b, n, h),)),
    },
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
    CORES,
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


def _widened(spec: registry.ParamSpec, times: int) -> registry.ParamSpec:
  return registry.ParamSpec(spec.shape[:-1] + (spec.shape[-1] * times,), spec.init)


@registry.register
class GatedDeltaProduct(gated_deltanet.GatedDeltaNet):
  """Gated DeltaNet's declaration with n_h keys, values and betas a token.

  k and v reach the short convolution widened to every step's, `[b, n, h, n_h * d]`
  (`conv_inputs`: the layer's projection first, then `keys` / `values` of the gates), and
  the recurrence reads them as `[b, n, h, n_h, d]`."""

  name = 'gated_deltaproduct'
  description = 'gated delta rule with n_h Householder steps a token (state tracking)'
  citation = 'Siems et al. 2025'
  options = tuple(
    dataclasses.replace(option, default=CHUNK, doc=CHUNK_DOC)
    if option.name == 'chunk_size'
    else option
    for option in gated_deltanet.GatedDeltaNet.options
  ) + (
    registry.Option(
      'num_householder',
      2,
      int,
      "delta steps (Householder factors) a token, each with its own key, value and beta "
      "(fla's layer: 2; 1 is Gated DeltaNet)",
      minimum=1,
    ),
    registry.Option(
      'allow_neg_eigval',
      True,
      bool,
      "beta in (0, 2), so the transition's eigenvalues reach (-1, 1) (fla's layer: True); "
      'False: beta in (0, 1)',
    ),
  )
  cores = CORES
  sharded_recurrence = staticmethod(product.householder_sharded)
  complexity = ('O(n n_h (c n_h d + d^2))', 'O(n n_h d + c^2 n_h^2 + d^2)')

  def params(self, options, *, heads, head_dim, max_length, causal):
    specs = super().params(
      options, heads=heads, head_dim=head_dim, max_length=max_length, causal=causal
    )
    for name in ('k_conv', 'k_conv_bias', 'v_conv', 'v_conv_bias'):
      if name in specs:  # one convolution over every step's keys (values)
        specs[name] = _widened(specs[name], options.num_householder)
    return specs

  def input_params(self, options, *, features, heads, head_dim):
    specs = super().input_params(options, features=features, heads=heads, head_dim=head_dim)
    more = options.num_householder - 1
    if more:
      _, qk_dim, v_dim = self.head_shapes(options, heads=heads, head_dim=head_dim)
      init = specs['beta_kernel'].init
      specs['keys_kernel'] = registry.ParamSpec((features, heads, more * qk_dim), init)
      specs['values_kernel'] = registry.ParamSpec((features, heads, more * v_dim), init)
      specs['betas_kernel'] = registry.ParamSpec((features, heads, more), init)
    return specs

  def gates(self, options, params, inputs):
    gates = super().gates(options, params, inputs)
    beta = gates['beta'][..., None]
    if options.num_householder > 1:
      more = jax.nn.sigmoid(gated_family.dense(inputs, params['betas_kernel']))
      beta = jnp.concatenate([beta, more], -1)
      gates['keys'] = gated_family.dense(inputs, params['keys_kernel'])
      gates['values'] = gated_family.dense(inputs, params['values_kernel'])
    gates['beta'] = 2.0 * beta if options.allow_neg_eigval else beta  # [b, n, h, n_h]
    return gates

  def conv_inputs(self, options, q, k, v, gates):
    if options.num_householder == 1:
      return q, k, v
    return q, *self._all_steps(k, v, gates)

  @staticmethod
  def _all_steps(k, v, gates):
    """k, v with the further steps' keys and values of `gates` after the layer's own,
    `[b, n, h, n_h * d]` (in the compute dtype)."""
    k, v, keys, values = (gated_family.upcast(x) for x in (k, v, gates['keys'], gates['values']))
    return jnp.concatenate([k, keys], -1), jnp.concatenate([v, values], -1)

  def _steps(self, q, k, v, gates):
    """k, v `[b, n, h, n_h, d]`: every step's, from the convolved (widened) k and v or, as
    the pure function's callers give them, the layer's first and the gates' further ones."""
    n_h = gates['beta'].shape[-1]
    if n_h > 1 and k.shape[-1] == q.shape[-1]:
      k, v = self._all_steps(k, v, gates)
    split = lambda x: x.reshape(x.shape[:-1] + (n_h, x.shape[-1] // n_h))
    return split(k), split(v)

  def recurrence_inputs(self, options, params, q, k, v, gates):
    k, v = self._steps(q, k, v, gates)
    q = norm.l2_normalize(q) / math.sqrt(q.shape[-1])
    return q, norm.l2_normalize(k), v, gates['log_decay'][..., None], gates['beta']

  def init_state(self, options, *, batch, heads, head_dim, v_dim):
    state = super().init_state(options, batch=batch, heads=heads, head_dim=head_dim, v_dim=v_dim)
    if not state.conv:
      return state
    n_h = options.num_householder
    q, k, v = state.conv
    wide = lambda x: jnp.zeros(x.shape[:-1] + (x.shape[-1] * n_h,), x.dtype)
    return state._replace(conv=(q, wide(k), wide(v)))

  def run_pure_function(self, q, k, v, gates, params, **kwargs):
    del params
    k, v = self._steps(q, k, v, gates)
    return gated_deltaproduct_attention(q, k, v, gates['beta'], gates['log_decay'], **kwargs)

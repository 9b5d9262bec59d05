"""Mamba-2's state space duality layer (Dao & Gu 2024, "Transformers are SSMs"): a scalar
data-dependent decay per head.

With the layer's queries as C, keys as B and values as X,

    dt_t = softplus(x_t W_dt + dt_bias),   a_t = exp(-exp(A_log) dt_t)     (per head),
    S_t = a_t S_{t-1} + dt_t B_t X_t^T,    y_t = S_t^T C_t + D X_t,

after the short causal convolution (kernel 4) and SiLU on C, B and X, as Mamba-2.
The output is the gated RMSNorm, norm(y * silu(z_t)) with z_t = x_t W_z, over the
full width (over each group's heads with `ngroups`, as mamba_ssm's RMSNormGated),
before the layer's out projection. Initialisation as mamba_ssm's Mamba2:
A uniform in [1, 16], dt log-uniform in [dt_min, dt_max] = [0.001, 0.1] through
dt_bias, D = 1, the convolution (with its bias, `conv_bias=True`, as mamba_ssm's
and fla's) and the dt and gate projections at PyTorch's module defaults;
`init='fla'` gives fla's N(0, 0.02) to the convolution and projections (zero bias).

Head layout. The paper's default (mamba_ssm's Mamba2: ngroups=1, d_state=128,
headdim=64) projects one B and one C of d_state features that every head shares,
the multi-value head pattern the paper argues for (only X, dt and the decay are
per head). `ngroups=1, d_state=128` builds it exactly: the 'query' (C) and 'key'
(B) projections are `[features, 1, d_state]`, the short convolution runs on the
one group (kernels `[4, 1, d_state]`, as Mamba-2's conv1d over x, B and C), and
after SiLU B and C are repeated to the heads (state `[d_state, head_dim]` per
head); `ngroups=g` shares each of g groups among heads / g heads (g divides the
heads; the gated norm then runs per group, as mamba_ssm's). The default
(ngroups=None, d_state=None) gives every head its own B and C of head_dim (Mamba-2's
ngroups = heads setting, with the norm over the full width: more parameters in the
q and k projections, the same recurrence) because it is the layout every projection
scheme builds: 'efficient' and 'super' slice keys into heads without a matrix,
so shared groups or another d_state need projection 'standard' or 'optimised',
and the layers refuse the others. The layer's `num_kv_heads` shares keys and
values, not queries and keys; the layers refuse it together with shared groups.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import gated_family
from efficient_attn.mechanisms import initializers
from efficient_attn.ops import gated
from efficient_attn.ops import norm
from efficient_attn.ops.gated import documents
from efficient_attn.ops.gated.common import scale_rows


def mamba2_attention(
  q,
  k,
  v,
  dt,
  A_log,  # pylint: disable=invalid-name
  D=None,  # pylint: disable=invalid-name
  mask=None,
  *,
  form: str = 'chunk',
  chunk_size: int = 64,
  segment_ids=None,
  initial_state=None,
  return_final_state: bool = False,
):
  """Mamba-2's SSD recurrence: S_t = a_t S_{t-1} + dt_t k_t v_t^T, y_t = S_t^T q_t + D v_t,
  a_t = exp(-exp(A_log) dt_t) per head (q is Mamba-2's C, k its B, v its X).

  The mechanism's recurrence alone (causal), on q, k, v as it reads them (after the
  layer's short convolution and SiLU); dt comes from the layer's projection
  (softplus(x W_dt + dt_bias)), and the gated output norm is not applied.

  Args:
    q, k: `[batch, length, heads, d_state]` (shared groups repeated to the heads);
      v: `[batch, length, heads, head_dim]`.
    dt: step sizes > 0, `[batch, length, heads]`.
    A_log: `[heads]`, the decay rate's log.
    D: optional skip weights `[heads]` (None: no skip term).
    mask: optional key padding `[batch, length]` (or a flax-style mask, reduced to
      one): a padded token neither writes to the state nor decays it (its output is 0).
    form: 'chunk' (chunkwise parallel) or 'naive' (token by token, the definition).
    chunk_size: tokens per chunk of the chunkwise form.
    segment_ids, initial_state, return_final_state: packed rows (0 is padding) and the
      state S `[batch, heads, d_state, head_dim]` in and out, as `gated_family.pure_recurrence`
      says.

  Returns:
    `[batch, length, heads, head_dim]` in v's dtype (computed in float32, or float64 where
    the inputs are), and with return_final_state the final state `[batch, heads, d_state,
    head_dim]`.
  """
  b, n, h, _ = q.shape
  call = gated_family.checked_call(
    'mamba2',
    'mamba2_attention',
    q,
    k,
    v,
    mask,
    {'dt': (dt, ((b, n, h),)), 'A_log': (A_log, ((h,),)), 'D': (D, ((h,),))},
    form=form,
    chunk_size=chunk_size,
    segment_ids=segment_ids,
    initial_state=initial_state,
  )
  q, k, v, dt = documents.zero_padding(call.real, q, k, v, jnp.asarray(dt))
  dt = gated_family.upcast(dt)[..., None]  # [b, n, h, 1]
  log_decay = -jnp.exp(gated_family.upcast(A_log))[:, None] * dt
  y, state = gated_family.pure_recurrence(
    gated.DECAY,
    q,
    scale_rows(gated_family.upcast(k), dt),
    v,
    log_decay,
    call=call,
    form=form,
    chunk_size=chunk_size,
    initial_state=initial_state,
  )
  if D is not None:
    y = y + gated_family.upcast(D)[:, None] * gated_family.upcast(v)
  return gated_family.finished(y, state, v.dtype, return_final_state)


@registry.register
class Mamba2(gated_family.GatedRecurrence):
  name = 'mamba2'
  description = "Mamba-2's SSD: a data-dependent scalar decay per head (A, dt)"
  citation = 'Dao & Gu 2024'
  options = (
    gated_family.common_options(conv_size=4, conv_bias=True)
    + (
      registry.Option(
        'ngroups',
        None,
        int,
        'B and C (keys and queries) groups shared by '
        'heads / ngroups heads (the paper: 1; None: one per head)',
        minimum=1,
        allow_none=True,
      ),
      registry.Option(
        'd_state',
        None,
        int,
        'width of B and C, the state size per head (the paper: 128; None: head_dim)',
        minimum=1,
        allow_none=True,
      ),
    )
    + gated_family.decay_options()
  )
  activation = 'silu'
  complexity = ('O(n c d + n d^2)', 'O(n d + d^2)')
  example = {'chunk_size': 4}

  def check_options(self, options):
    gated_family.check_dt_range(self.name, options)

  def qk_heads(self, options, heads):
    return options.ngroups or heads

  def head_shapes(self, options, *, heads, head_dim):
    return self.qk_heads(options, heads), options.d_state or head_dim, head_dim

  def own_params(self, options, *, heads, head_dim):
    return {
      'A_log': registry.ParamSpec((heads,), initializers.a_log_init(1.0, 16.0)),
      'dt_bias': registry.ParamSpec((heads,), gated_family.dt_init(options)),
      'D': registry.ParamSpec((heads,), initializers.ones_init),
      'norm_scale': registry.ParamSpec((heads, head_dim), initializers.ones_init),
    }

  def input_params(self, options, *, features, heads, head_dim):
    init = self.init_for(options, initializers.torch_linear_init)
    return {
      'dt_kernel': registry.ParamSpec((features, heads), init),
      'gate_kernel': registry.ParamSpec((features, heads, head_dim), init),
    }

  def gates(self, options, params, inputs):
    dt = jax.nn.softplus(gated_family.dense(inputs, params['dt_kernel'], params['dt_bias']))
    return {'dt': dt, 'output': gated_family.dense(inputs, params['gate_kernel'])}

  def recurrence_inputs(self, options, params, q, k, v, gates):
    dt = gates['dt'][..., None]  # [b, n, h, 1]
    log_decay = -jnp.exp(gated_family.upcast(params['A_log']))[:, None] * dt
    return q, scale_rows(k, dt), v, log_decay, None

  def skip(self, options, params, v):
    return gated_family.upcast(params['D'])[:, None] * v  # y = S^T C + D X

  def finish(self, options, params, out, v, gates):
    y = (out + self.skip(options, params, v)) * nn.swish(gates['output'])
    if not options.ngroups:  # the norm over the full width
      return norm.rms_norm(y, params['norm_scale'], axes=(-2, -1))
    b, n, h, d = y.shape  # one norm per group of heads / ngroups heads, as mamba_ssm's
    y = norm.rms_norm(y.reshape(b, n, options.ngroups, h // options.ngroups * d))
    return y.reshape(b, n, h, d) * gated_family.upcast(params['norm_scale'])

  def run_pure_function(self, q, k, v, gates, params, **kwargs):
    return mamba2_attention(q, k, v, gates['dt'], params['A_log'], params['D'], **kwargs)

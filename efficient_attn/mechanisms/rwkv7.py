"""RWKV-7 "Goose" (Peng et al. 2025): the time-mix block's generalised delta rule, a
diagonal-plus-low-rank (DPLR) transition per token, as flash-linear-attention's RWKV7Attention.

    S_t = (diag(w_t) - (alpha_t * kappa_t) kappa_t^T) S_{t-1} + k~_t v_t^T,   o_t = S_t^T r_t,

with the state S `[dk, dv]` (fla's and the paper's S is its transpose: S_t = S_{t-1}
(diag(w_t) - kappa^T (alpha kappa)) + v^T k~), r, k, v the layer's query, key and value
projections, and per token, from the layer input x:

    w_t = exp(-exp(-1/2) sigmoid(w_0 + tanh(x_w W_1) W_2))     the decay, in (0.545, 1)
    alpha_t = sigmoid(a_0 + x_a A_1 A_2)                         the in-context learning rate
    kappa_t = l2norm(k_t * k_k)                                  the removal key, per head
    k~_t = k_t * (1 + (alpha_t - 1) * k_a)                       the write key
    g_t = sigmoid(x_g G_1) G_2                                   the output gate

and the output ((GroupNorm(o_t) + (r_t . (r_k * k~_t)) v_t) * g_t), the per-head group norm
(eps = 1e-5 head_dim) and the bonus term read after the recurrence. The ranks of the
LoRAs default to the paper's 0.1B model (and fla's at width 768): 64 (decay), 64 (alpha)
and 128 (gate). fla's initialisation of a layer with the first layer's ratios: the
LoRAs' down projections 0, their up projections orthogonal with gain 0.1, w_0 = -6 +
6 i / (N - 1) + 0.5 + 2.5 zigzag, a_0 = -0.19 + 0.3 zigzag + 0.4 linear, k_k = 0.71 - 0.1
linear, k_a = 1.02, r_k = -0.04, the norm's scale 1 and bias 0.

Token shift (`token_shift`, fla's `token_shift`; on by default, as in RWKV): each input is
the lerp of the token and the one before, x + (x_{t-1} - x) mu, with a learned mu per
input. For the gates it is fla's, per feature of the layer input (mu_decay, mu_a,
mu_gate): the LoRAs' first products are linear, so the layer's gates keep (x (1 - mu)) W_1
of each token and (x mu) W_1, which the next token reads (gate 'shift'; the decoding state
keeps the last one, constant size). r, k and v are projected by the layer, so their lerp
is on the projected features (mu_r, mu_k, mu_v `[heads, head_dim]`): a depthwise causal
convolution of two taps (mu, 1 - mu), equal to fla's lerp where fla's mu is one value for
all the input's features. The shift never crosses a document boundary, and a padding gap
reads zeros (docs/design.md "Documents").

Not here: the value residual across layers (v_first: layer 0's values mixed into every
later layer's by a learned lerp) needs a value passed between the layers of a model,
which this layer-level declaration does not carry; each layer uses its own v. The
channel-mix block (the feed-forward) is the model's.

The chunkwise form is `efficient_attn.ops.dplr.dplr_chunked` (WY form, a = -kappa,
b = alpha * kappa); the sequence split composes each block's state transition
(`efficient_attn.ops.delta.transition_sharded`). No Pallas kernel yet (so no
`implementation` option); a prefill is the decoding step in a scan.
"""

import copy
import math

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import gated_family
from efficient_attn.mechanisms import initializers
from efficient_attn.ops import collectives
from efficient_attn.ops import delta
from efficient_attn.ops import dplr
from efficient_attn.ops import masking
from efficient_attn.ops import norm
from efficient_attn.ops import segments
from efficient_attn.ops import short_conv
from efficient_attn.ops.gated import documents

F32 = jnp.float32
DECAY_SCALE = math.exp(-0.5)  # log w = -exp(-1/2) sigmoid(.): w in (0.545, 1)
NORM_EPS = 1e-5  # the group norm's eps is NORM_EPS * head_dim (fla's)
LORAS = ('decay', 'a', 'gate')
SHIFTED = {'q': 'mu_r', 'k': 'mu_k', 'v': 'mu_v'}  # the lerp of each projection


def rwkv7_attention(
  r,
  k,
  v,
  log_decay,
  removal_key,
  rate,
  mask=None,
  *,
  form: str = 'chunk',
  chunk_size: int = 64,
  segment_ids=None,
  initial_state=None,
  return_final_state: bool = False,
):
  """RWKV-7's recurrence: S_t = (diag(exp(log_decay_t)) - (rate_t * kappa_t) kappa_t^T)
  S_{t-1} + k_t v_t^T, o_t = S_t^T r_t (no 1/sqrt(dk): RWKV-7's scale is 1).

  The mechanism's recurrence alone (causal), on its inputs as the layer builds them (the
  write key k~, the normalised removal key kappa, the decay and the in-context rate come
  from its token shift and LoRAs); the group norm, the bonus term and the output gate are
  not applied.

  Args:
    r, k: `[batch, length, heads, dk]` (receptance and write key); v: `[batch, length,
      heads, dv]`.
    log_decay: log w_t <= 0, `[batch, length, heads, dk]` (or `[..., 1]`, one per head).
    removal_key: kappa_t `[batch, length, heads, dk]` (RWKV-7's is L2-normalised per head).
    rate: alpha_t in (0, 1), `[batch, length, heads, dk]`.
    mask: optional key padding `[batch, length]` (or a flax-style mask, reduced to one): a
      padded token neither writes to the state nor decays it (its output is 0).
    form: 'chunk' (chunkwise, the WY form) or 'naive' (token by token, the definition).
    chunk_size: tokens per chunk of the chunkwise form.
    segment_ids, initial_state, return_final_state: packed rows (0 is padding) and the
      state S `[batch, heads, dk, dv]` in and out, as `gated_family.pure_recurrence` says.

  Returns:
    `[batch, length, heads, dv]` in v's dtype (computed in float32, or float64 where the
    inputs are), and with return_final_state the final state `[batch, heads, dk, dv]`.
  """
  b, n, h, dk = r.shape
  full = ((b, n, h, dk),)
  call = gated_family.checked_call(
    'rwkv7',
    'rwkv7_attention',
    r,
    k,
    v,
    mask,
    {
      'log_decay': (log_decay, full + ((b, n, h, 1),)),
      'removal_key': (removal_key, full),
      'rate': (rate, full),
    },
    form=form,
    chunk_size=chunk_size,
    segment_ids=segment_ids,
    initial_state=initial_state,
  )
  kappa, rate = gated_family.upcast(removal_key), gated_family.upcast(rate)
  ab = jnp.stack([-kappa, rate * kappa], axis=3)
  (g, ab) = documents.zero_padding(call.real, gated_family.upcast(log_decay), ab)
  out, state = gated_family.pure_recurrence(
    dplr.DPLR,
    r,
    k,
    v,
    g,
    ab,
    call=call,
    form=form,
    chunk_size=chunk_size,
    initial_state=initial_state,
  )
  return gated_family.finished(out, state, v.dtype, return_final_state)


def group_norm(x, scale, bias, eps: float):
  """Per-head layer norm over the last axis of x `[b, n, h, d]` (fla's GroupNorm with one
  group a head), times scale plus bias `[h, d]`; float32 (float64 where x is)."""
  x = gated_family.upcast(x)
  centred = x - jnp.mean(x, axis=-1, keepdims=True)
  inv = jax.lax.rsqrt(jnp.mean(jnp.square(centred), axis=-1, keepdims=True) + eps)
  return centred * inv * scale.astype(x.dtype) + bias.astype(x.dtype)


@registry.register
class RWKV7(gated_family.GatedRecurrence):
  name = 'rwkv7'
  description = 'the generalised delta rule: vector decay, in-context rate, removal key (DPLR)'
  citation = 'Peng et al. 2025'
  options = (
    registry.Option('chunk_size', 64, int, 'chunk length of the chunkwise form', minimum=1),
    registry.Option(
      'form',
      'chunk',
      str,
      'chunk: chunkwise parallel, the WY form (training); naive: the token-by-token '
      'recurrence (the definition)',
      choices=('chunk', 'naive'),
    ),
    registry.Option(
      'token_shift', True, bool, 'mix each input with the token before it (learned lerp)'
    ),
    registry.Option('decay_rank', 64, int, 'rank of the decay LoRA', minimum=1),
    registry.Option('a_rank', 64, int, 'rank of the in-context rate LoRA', minimum=1),
    registry.Option('gate_rank', 128, int, 'rank of the output gate LoRA', minimum=1),
  )
  cores = dplr.DPLR
  sequence_parallel = 'transition'
  sharded_recurrence = staticmethod(delta.transition_sharded)
  complexity = ('O(n c d + n d^2)', 'O(n d + c^2 d + d^2)')
  example = {'chunk_size': 4, 'decay_rank': 4, 'a_rank': 4, 'gate_rank': 4}

  def params(self, options, *, heads, head_dim, max_length, causal):
    del max_length, causal
    shape = (heads, head_dim)
    spec = lambda init: registry.ParamSpec(shape, init)
    specs = {
      'decay_bias': spec(initializers.rwkv7_decay_bias(head_dim)),
      'a_bias': spec(initializers.rwkv7_a_bias(head_dim)),
      'k_k': spec(initializers.rwkv7_k_k),
      'k_a': spec(initializers.constant_init(1.02)),
      'r_k': spec(initializers.constant_init(-0.04)),
      'norm_scale': spec(initializers.ones_init),
      'norm_bias': spec(initializers.zeros_init),
    }
    if options.token_shift:
      for name, power in (('r', 0.2), ('k', 0.7), ('v', 0.7)):
        specs[f'mu_{name}'] = spec(initializers.token_shift_init(power))
    return specs

  def input_params(self, options, *, features, heads, head_dim):
    specs = {}
    for lora, power in zip(LORAS, (0.9, 0.9, 0.2)):
      rank = options[f'{lora}_rank']
      specs[f'{lora}_down'] = registry.ParamSpec((features, rank), initializers.zeros_init)
      specs[f'{lora}_up'] = registry.ParamSpec((rank, heads, head_dim), initializers.lora_up_init)
      if options.token_shift:
        specs[f'mu_{lora}'] = registry.ParamSpec((features,), initializers.token_shift_init(power))
    return specs

  def gates(self, options, params, inputs):
    """The LoRAs' first products of each token (`[b, n, rank]`): x W_1 (with token shift,
    (x (1 - mu)) W_1, and 'shift': the (x mu) W_1 of the three, concatenated, which the next
    token adds to its own)."""
    x = gated_family.upcast(inputs)
    if not options.token_shift:
      return {lora: gated_family.dense(x, params[f'{lora}_down']) for lora in LORAS}
    mus = {lora: gated_family.upcast(params[f'mu_{lora}']) for lora in LORAS}
    out = {lora: gated_family.dense(x * (1 - mus[lora]), params[f'{lora}_down']) for lora in LORAS}
    out['shift'] = jnp.concatenate(
      [gated_family.dense(x * mus[lora], params[f'{lora}_down']) for lora in LORAS], -1
    )
    return out

  @staticmethod
  def _low_rank(gates, lora):
    """The LoRA `lora`'s first product `[b, n, rank]`, with the token before's share where
    the gates have one (token shift: gates['shift'], already shifted, the three's shares
    concatenated in `LORAS`' order)."""
    x = gates[lora]
    if 'shift' not in gates:
      return x
    start = sum(gates[name].shape[-1] for name in LORAS[: LORAS.index(lora)])
    return x + gates['shift'][..., start : start + x.shape[-1]]

  def _keys_and_gates(self, params, k, gates):
    """(log_decay, rate, kappa, write key k~), each `[b, n, h, dk]`, of keys k and gates."""
    up = lambda x, lora, bias: gated_family.dense(x, params[f'{lora}_up'], params[bias])
    log_decay = -DECAY_SCALE * jax.nn.sigmoid(
      up(jnp.tanh(self._low_rank(gates, 'decay')), 'decay', 'decay_bias')
    )
    rate = jax.nn.sigmoid(up(self._low_rank(gates, 'a'), 'a', 'a_bias'))
    k = gated_family.upcast(k)
    kappa = norm.l2_normalize(k * gated_family.upcast(params['k_k']))
    return log_decay, rate, kappa, k * (1 + (rate - 1) * gated_family.upcast(params['k_a']))

  def recurrence_inputs(self, options, params, q, k, v, gates):
    log_decay, rate, kappa, k = self._keys_and_gates(params, k, gates)
    ab = jnp.stack([-kappa, rate * kappa], axis=3)
    return gated_family.upcast(q), k, gated_family.upcast(v), log_decay, ab

  def finish(self, options, params, out, v, gates):
    """(GroupNorm(o) + bonus * v) * g, 0 at a padded token (gates 'bonus' `[b, n, h, 1]`
    and 'real' `[b, n]`, set with the recurrence's inputs: `_with_bonus`)."""
    eps = NORM_EPS * out.shape[-1]
    out = group_norm(out, params['norm_scale'], params['norm_bias'], eps)
    out = out + gates['bonus'] * gated_family.upcast(v)
    gate = jax.nn.sigmoid(self._low_rank(gates, 'gate'))
    out = out * gated_family.dense(gate, params['gate_up'])
    return documents.zero_padding(gates['real'], out)[0]

  def run_pure_function(self, q, k, v, gates, params, **kwargs):
    log_decay, rate, kappa, k = self._keys_and_gates(params, k, gates)
    return rwkv7_attention(q, k, v, log_decay, kappa, rate, **kwargs)

  # The layer's forms: the token shift (a two-tap convolution of r, k, v; the gates'
  # 'shift' moved one token on, within documents), the bonus and the padding for `finish`.

  def core(self, options, dtype, packed: bool = False):
    del dtype, packed  # every form takes segment ids; no Pallas kernel yet
    return self.cores.chunked if options.form == 'chunk' else self.cores.scan

  @staticmethod
  def _conv_options(options):
    """The shared declaration's convolution options: two taps with token shift, else none."""
    return registry.Options(
      {**options, 'conv_size': 2 if options.token_shift else 0, 'conv_bias': False}
    )

  @staticmethod
  def _shift_kernel(mu):
    """The two taps (x_{t-1}, x_t) of the lerp x_t + (x_{t-1} - x_t) mu: `[2, ...]`."""
    mu = gated_family.upcast(mu)
    return jnp.stack([mu, 1 - mu])

  def _features(self, options, params, q, k, v, axis=None, segment_ids=None):
    if options.token_shift:
      params = {
        **params,
        **{f'{n}_conv': self._shift_kernel(params[mu]) for n, mu in SHIFTED.items()},
      }
    return super()._features(self._conv_options(options), params, q, k, v, axis, segment_ids)

  def _shifted(self, x, ids, axis):
    """x `[b, n, r]` one token on within its document (0 at a document's first token and
    after padding); with the sequence split over `axis`, the block reads the previous
    device's last token."""
    taps = jnp.stack([jnp.ones(x.shape[-1:], x.dtype), jnp.zeros(x.shape[-1:], x.dtype)])[:, None]
    x = x[:, :, None]
    if axis is not None:
      if ids is not None:
        ids = jnp.concatenate([collectives.halo_before(ids, 1, axis), ids], 1)
      x = jnp.concatenate([collectives.halo_before(x, 1, axis), x], 1)
    out = short_conv.causal_conv(x, taps, segment_ids=ids)[:, :, 0]
    return out if axis is None else out[:, 1:]

  def _inputs(self, options, params, q, k, v, *, mask, causal, ctx, axis=None):
    if options.token_shift and ctx.gates is not None and causal:
      b, n = v.shape[:2]
      real = masking.key_padding_from_mask(mask, b, n)
      ids = None
      if ctx.documents is not None:
        ids = documents.as_segment_ids(segments.check(ctx.documents, b, n, self.name), real)
      elif real is not None:
        ids = real.astype(jnp.int32)
      ctx = copy.copy(ctx)
      ctx.gates = {**ctx.gates, 'shift': self._shifted(ctx.gates['shift'], ids, axis)}
    q, k, v, g, ab, gates, ids = super()._inputs(
      options, params, q, k, v, mask=mask, causal=causal, ctx=ctx, axis=axis
    )
    real = None if mask is None else masking.key_padding_from_mask(mask, *v.shape[:2])
    if ids is not None:
      real = ids != 0
    return q, k, v, g, ab, self._with_bonus(params, q, k, gates, real), ids

  @staticmethod
  def _with_bonus(params, r, k, gates, real):
    """gates with 'bonus' (r . (r_k * k~)) `[b, n, h, 1]` and 'real' `[b, n]` (None: all)."""
    r, k = gated_family.upcast(r), gated_family.upcast(k)
    bonus = jnp.sum(r * k * gated_family.upcast(params['r_k']), axis=-1, keepdims=True)
    return {**gates, 'bonus': bonus, 'real': real}

  def init_state(self, options, *, batch, heads, head_dim, v_dim):
    state = super().init_state(
      self._conv_options(options), batch=batch, heads=heads, head_dim=head_dim, v_dim=v_dim
    )
    if not options.token_shift:
      return state
    ranks = sum(options[f'{lora}_rank'] for lora in LORAS)
    shift = jnp.zeros((batch, 1, 1, ranks), F32)  # the last token's (x mu) W_1
    return state._replace(conv=state.conv + (shift,))

  def step(self, options, params, state, q_t, k_t, v_t, *, ctx):
    """One token (as the shared declaration's step): the token shift's history is the last
    real token's q, k, v and gate shares (cleared at a new document; a padding token leaves
    it), then the recurrence's step, the bonus and `finish`."""
    dtype = v_t.dtype
    conv = state.conv
    segment, s, real, reset, (q_t, k_t, v_t), gates = self.step_documents(
      state, (q_t, k_t, v_t), ctx
    )
    if options.token_shift:
      kernels = [self._shift_kernel(params[mu]) for mu in SHIFTED.values()]
      kernels.append(self._shift_kernel(jnp.ones(conv[3].shape[2:], F32)))
      xs = (q_t, k_t, v_t, gates['shift'][:, :, None])
      steps = [
        short_conv.causal_conv_step(hist, x, w, reset=reset, real=real)
        for hist, x, w in zip(conv, xs, kernels)
      ]
      conv = tuple(h.astype(old.dtype) for (h, _), old in zip(steps, conv))
      q_t, k_t, v_t, shift = (y for _, y in steps)
      gates = {**gates, 'shift': shift[:, :, 0]}
    q_t, k_t, v_t, g, ab = self.recurrence_inputs(options, params, q_t, k_t, v_t, gates)
    if real is not None:
      q_t, k_t, v_t, g, ab = documents.zero_padding(real[:, None], q_t, k_t, v_t, g, ab)
    s_new, out = self.cores.step(s, q_t[:, 0], k_t[:, 0], v_t[:, 0], g[:, 0], ab[:, 0])
    gates = self._with_bonus(params, q_t, k_t, gates, None if real is None else real[:, None])
    out = self.finish(options, params, out[:, None], v_t, gates).astype(dtype)
    return gated_family.RecurrentState(s_new.astype(state.s.dtype), conv, segment), out

"""Forgetting Attention (Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a
Forget Gate"): causal softmax attention with a data-dependent forget gate per head,

    f_t = sigmoid(x_t w_f + b_f),   F_i = sum_{l <= i} log f_l,
    o_i = sum_{j <= i} softmax_j(q_i . k_j / sqrt(d) + F_i - F_j) v_j,

so a key's weight decays by the product of the gates between it and the query (f = 1:
causal softmax). Exact, in O(n) memory: the bias F_i - F_j is a query term plus a key term,
added per block of FlashAttention's blocks (`softmax.chunked_softmax_attention`'s `bias`,
`efficient_attn.ops.flash`), F kept in float32 whatever the inputs' dtype
(`efficient_attn.ops.forget_bias`).

Defaults: the paper's basic FoX, as flash-linear-attention's `ForgettingAttention` layer
builds it: the gate projection `f_proj` (features -> heads, with a bias, PyTorch's Linear
initialisation; `init='fla'`: N(0, 0.02) and a zero bias, fla's model initialisation), no
output gate, no QK-norm (the layers' `normalize_qk` gives the "Pro" block's), no
positional encoding needed (rotary allowed). `output_gate=True` adds the Pro block's
output gate, o * sigmoid(x W_g) (fla's `use_output_gate`). The Pro block's
data-dependent token shift of the keys and values is not here.

Decoding keeps every key, value and its F (`forget_bias.Cache`, a state that grows with
the stream: `state_capacity`); packed rows keep each token to its document, exactly. With
the sequence split over devices it is softmax's ring (`collectives.ring_attention`) with
the bias travelling with its keys.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import gated_family
from efficient_attn.mechanisms import initializers
from efficient_attn.mechanisms import softmax
from efficient_attn.ops import collectives
from efficient_attn.ops import forget_bias
from efficient_attn.ops import masking
from efficient_attn.ops import segments
from efficient_attn.ops.scaled_dot_product import default_scale

FORMS = ('chunked', 'dense')


def _attention(q, k, v, log_forget, real, documents, *, form, scale, q_chunk, k_chunk):
  """The forms on checked inputs: real `[b, n]` bool or None, documents a
  `masking.document_pair` or None. `[b, n, h, dv]` in v's dtype, 0 at padded tokens."""
  forget = forget_bias.cumulative(log_forget, real)
  scale = default_scale(q.shape[-1], scale)
  if form == 'dense':
    out = forget_bias.dense_attention(
      q, k, v, forget, scale=scale, key_padding=real, documents=documents
    )
  else:
    out = softmax.chunked_softmax_attention(
      q,
      k,
      v,
      mask=real,
      causal=True,
      scale=scale,
      q_chunk=q_chunk,
      k_chunk=k_chunk,
      documents=documents,
      bias=(forget, -forget),
    )
  return masking.zero_padded(out, real).astype(v.dtype)


def forgetting_attention(
  q,
  k,
  v,
  log_forget,
  mask=None,
  *,
  form: str = 'chunked',
  scale: Optional[float] = None,
  q_chunk: int = 256,
  k_chunk: int = 512,
  segment_ids=None,
):
  """Forgetting Attention: o_i = sum_{j <= i} softmax_j(q_i . k_j * scale + F_i - F_j) v_j.

  Args:
    q, k: `[batch, length, heads, dk]`; v: `[batch, length, heads, dv]`.
    log_forget: log f_t <= 0, `[batch, length, heads]` (the layer's log_sigmoid(x w_f +
      b_f)); F is its running sum in float32 (or wider).
    mask: optional key padding `[batch, length]` (or a flax-style mask, reduced to one): a
      padded token is no key, decays nothing and its output is 0.
    form: 'chunked' (FlashAttention's blocks, O(n) memory, `q_chunk` x `k_chunk` scores at
      a time) or 'dense' (the n x n scores, the definition).
    scale: score scale; None: 1 / sqrt(dk).
    segment_ids: optional `[batch, length]` int, a packed row (0 is padding): each token
      reads only its own document's keys.

  Returns:
    `[batch, length, heads, dv]` in v's dtype (computed in float32, or float64 where the
    inputs are).
  """
  name = 'forgetting_attention'
  masking.check_inputs(q, k, v, mask, name=name, same_length=True)
  registry.check_arguments(
    'forgetting', name, form=form, scale=scale, q_chunk=q_chunk, k_chunk=k_chunk
  )
  b, n, h = q.shape[:3]
  if tuple(jnp.shape(log_forget)) != (b, n, h):
    raise ValueError(
      f'{name}: log_forget of shape {tuple(jnp.shape(log_forget))} does not fit q '
      f'{tuple(q.shape)}; valid: [batch, length, heads] = {[b, n, h]}'
    )
  real = masking.key_padding_from_mask(mask, b, n)
  documents = None
  if segment_ids is not None:
    ids = segments.check(segment_ids, b, n, name)
    real = segments.is_real(ids) if real is None else real & segments.is_real(ids)
    documents = masking.document_pair(segments.document_index(ids), real, real)
  return _attention(
    q,
    k,
    v,
    log_forget,
    real,
    documents,
    form=form,
    scale=scale,
    q_chunk=q_chunk,
    k_chunk=k_chunk,
  )


@registry.register
class Forgetting(registry.Mechanism):
  name = 'forgetting'
  rotary = 'scores'
  description = 'softmax attention with a data-dependent forget gate: scores + F_i - F_j'
  citation = 'Lin et al. 2025'
  options = (
    registry.Option(
      'form',
      'chunked',
      str,
      "chunked: FlashAttention's blocks with the forget bias per block, O(n) memory; "
      'dense: the n x n scores (the definition)',
      choices=FORMS,
    ),
    registry.Option('q_chunk', 256, int, 'queries per chunk', minimum=1),
    registry.Option('k_chunk', 512, int, 'keys per chunk', minimum=1),
    softmax.SCALE,
    registry.Option(
      'output_gate', False, bool, "the Pro block's output gate o * sigmoid(x W_g) (fla's)"
    ),
    registry.Option(
      'init',
      'default',
      str,
      "the gate projections' initialisation: default (PyTorch's Linear, fla's layer) or "
      'fla (N(0, 0.02), zero bias: its model initialisation)',
      choices=gated_family.INITS,
    ),
  )
  causal = True
  causal_only = True
  reads_input = True
  masks = 'key_padding'
  decode = 'recurrent'
  state_capacity = True
  segments = True
  sequence_parallel = 'ring'
  complexity = ('O(n^2 d)', 'O(n d + c^2)')
  example = {'q_chunk': 8, 'k_chunk': 4}

  def input_params(self, options, *, features, heads, head_dim):
    fla = options.init == 'fla'
    kernel = initializers.fla_init if fla else initializers.torch_linear_init
    bound = 1.0 / features**0.5  # PyTorch's Linear bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    bias = (
      initializers.zeros_init
      if fla
      else lambda key, shape, dtype=jnp.float32: jax.random.uniform(
        key, shape, jnp.float32, -bound, bound
      ).astype(dtype)
    )
    specs = {
      'forget_kernel': registry.ParamSpec((features, heads), kernel),
      'forget_bias': registry.ParamSpec((heads,), bias),
    }
    if options.output_gate:
      specs['gate_kernel'] = registry.ParamSpec((features, heads, head_dim), kernel)
    return specs

  def gates(self, options, params, inputs):
    logits = gated_family.dense(inputs, params['forget_kernel'], params['forget_bias'])
    gates = {'log_forget': jax.nn.log_sigmoid(logits)}
    if options.output_gate:
      gates['output'] = gated_family.dense(inputs, params['gate_kernel'])
    return gates

  def _finish(self, options, out, gates):
    if options.output_gate:
      out = out * jax.nn.sigmoid(gates['output']).astype(out.dtype)
    return out

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    if not causal:
      raise ValueError(f'mechanism {self.name!r} is causal only: call it with causal=True')
    k, v, real = masking.checked_keys_values(q, k, v, mask, name=self.name, causal=True)
    documents = masking.context_documents(ctx.documents, real, *q.shape[:2], k.shape[1], self.name)
    out = _attention(
      q,
      k,
      v,
      ctx.gates['log_forget'],
      real,
      documents,
      form=options.form,
      scale=options.scale,
      q_chunk=options.q_chunk,
      k_chunk=options.k_chunk,
    )
    return self._finish(options, out, ctx.gates)

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    """Ring attention (`softmax.ring_softmax`) with the forget bias: each device's F is its
    block's running sum plus the sum of log f over the devices before it (an exclusive
    scan over `axis`), and each key block travels with its F."""
    if not causal:
      raise ValueError(f'mechanism {self.name!r} is causal only: call it with causal=True')
    k, v, real = masking.checked_keys_values(q, k, v, mask, name=self.name, causal=True)
    forget = forget_bias.cumulative(ctx.gates['log_forget'], real)
    total = forget[:, -1]
    forget = (
      forget + collectives.exclusive_scan(jnp.add, total, jnp.zeros_like(total), axis)[:, None]
    )
    if options.form == 'dense':
      block = softmax.DENSE_BLOCK
    else:
      block = softmax.chunked_block(options.q_chunk, options.k_chunk)
    out = softmax.ring_softmax(
      options, q, k, v, real, True, axis, block, ctx.documents, bias=(forget, -forget)
    )
    return self._finish(options, masking.zero_padded(out, real), ctx.gates)

  def init_state(self, options, *, batch, heads, head_dim, v_dim, capacity=None, dtype=None):
    if capacity is None:
      raise ValueError(
        f'mechanism {self.name!r} decodes from a cache of every token: init_state needs '
        f'capacity (the longest stream)'
      )
    return forget_bias.init_cache(batch, capacity, heads, head_dim, v_dim, dtype or jnp.float32)

  def prefill(self, options, params, state, q, k, v, *, ctx):
    """n tokens through the cache (`forget_bias.decode`); `ctx.documents` the raw segment
    ids `[batch, n]` (0: padding) or None."""
    scale = default_scale(q.shape[-1], options.scale)
    state, out = forget_bias.decode(
      state, q, k, v, ctx.gates['log_forget'], scale=scale, segment_ids=ctx.documents
    )
    return state, self._finish(options, out, ctx.gates)

  step = prefill

"""The declaration the gated linear attentions share, and what their pure functions share.

`GatedRecurrence` is the mechanism declaration of retention, GLA, Mamba-2, DeltaNet and
Gated DeltaNet (not registered itself): causal only, key padding (a padded token neither
writes to the state nor decays it), packed rows (`ctx.documents`: every form keeps each
token to its document, docs/design.md "Documents"), the optional short causal convolution
on q, k and v with its decoding state (`efficient_attn.ops.short_conv`), gates read from
the layer input (`registry.Mechanism.reads_input`), and the recurrence's forms (`Cores`:
`efficient_attn.ops.gated.DECAY` or `efficient_attn.ops.delta.DELTA`). Each mechanism
file adds its gates and its output (norm and gate).

The options every gated recurrence has (`common_options`; Mamba's dt range,
`decay_options`) and the checks and recurrence of the pure functions (`checked_call`,
`pure_recurrence`) are here too.
"""

import functools
from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from efficient_attn import registry
from efficient_attn.mechanisms import initializers
from efficient_attn.ops import collectives
from efficient_attn.ops import gated
from efficient_attn.ops import kernels
from efficient_attn.ops import masking
from efficient_attn.ops import segments
from efficient_attn.ops import short_conv
from efficient_attn.ops.gated import documents
from efficient_attn.ops.gated.common import compute_dtype

F32 = jnp.float32
INITS = ('default', 'fla')


def common_options(
  conv_size: int, conv_bias: bool = False, default_init: str = "PyTorch's module defaults"
) -> Tuple[registry.Option, ...]:
  """The options every gated recurrence has (`conv_size`, `conv_bias`: the reference's
  defaults; `default_init`: what init='default' is, for the option's doc)."""
  return (
    registry.Option('chunk_size', 64, int, 'chunk length of the chunkwise form', minimum=1),
    registry.Option(
      'form',
      'chunk',
      str,
      "chunk: chunkwise parallel (training); naive: the token-by-token recurrence (the definition)",
      choices=('chunk', 'naive'),
    ),
    registry.Option(
      'conv_size',
      conv_size,
      int,
      'kernel of the short causal convolution on q, k and v (0: none)',
      minimum=0,
    ),
    registry.Option('conv_bias', conv_bias, bool, 'a bias in the short convolution'),
    registry.Option(
      'init',
      'default',
      str,
      f'initialisation of the convolution and the '
      f'gate projections: default ({default_init}) or fla (N(0, 0.02), '
      f"flash-linear-attention's model initialisation)",
      choices=INITS,
    ),
    registry.Option(
      'implementation',
      'auto',
      str,
      "the chunk form's code: xla, or pallas "
      '(the Pallas kernels of efficient_attn.ops.kernels; interpreted on CPU); '
      'auto: xla until a measurement shows a kernel faster',
      choices=kernels.IMPLEMENTATIONS,
    ),
  )


def decay_options() -> Tuple[registry.Option, ...]:
  """Mamba's dt range at initialisation (Mamba-2, Gated DeltaNet): the decay starts at
  a = exp(-A dt), dt log-uniform in [dt_min, dt_max]."""
  return (
    registry.Option(
      'dt_min',
      initializers.DT_MIN,
      float,
      'smallest dt at initialisation (Mamba: 0.001)',
      above=0.0,
    ),
    registry.Option(
      'dt_max', initializers.DT_MAX, float, 'largest dt at initialisation (Mamba: 0.1)', above=0.0
    ),
  )


def dt_init(options):
  """The dt bias initialiser of `options` (with `decay_options`)."""
  return functools.partial(initializers.dt_bias_init, dt_min=options.dt_min, dt_max=options.dt_max)


def check_dt_range(name: str, options) -> None:
  if options.dt_min > options.dt_max:
    raise ValueError(
      f'mechanism {name!r}: dt_min={options.dt_min} exceeds dt_max={options.dt_max}; '
      f'the initial dt range needs dt_min <= dt_max'
    )


def upcast(x):
  """x in its compute dtype: float32, or float64 where x is float64."""
  x = jnp.asarray(x)
  return x.astype(compute_dtype(x))


def dense(x, kernel, bias=None):
  """x `[b, n, features]` times kernel `[features, ...]` (+ bias), in float32 (float64 where
  one is): a gate's projection of the layer input."""
  dtype = compute_dtype(x, kernel, bias)
  y = jnp.tensordot(x.astype(dtype), kernel.astype(dtype), axes=1)
  return y if bias is None else y + bias.astype(dtype)


# The pure functions (`retention_attention`, `gla_attention`, `mamba2_attention`,
# `deltanet_attention`): the recurrence alone on q, k, v as it reads them, without the
# parameters of the layer around it (short convolution, gate projections, output norm).


class PureCall(NamedTuple):
  """A pure function's call after its checks: `real` `[b, n]` bool (None: no padding), the
  tokens that are neither masked nor segment 0, and `segment_ids` `[b, n]` int32 (None:
  one document a row) with the masked tokens set to 0."""

  real: Optional[jnp.ndarray]
  segment_ids: Optional[jnp.ndarray]


def checked_call(
  mechanism: str,
  function: str,
  q,
  k,
  v,
  mask,
  gates,
  *,
  form: str,
  chunk_size: int,
  segment_ids=None,
  initial_state=None,
) -> PureCall:
  """The `PureCall` of a pure function's call, after its checks: q, k, v `[b, n, h, d]`
  (`masking.check_inputs`), `gates` ({name: (array, allowed shapes)}), the options `form`
  and `chunk_size` (`mechanism`'s Options), `segment_ids` `[b, n]` and `initial_state`
  `[b, h, dk, dv]`; one-line ValueErrors naming `function`."""
  masking.check_inputs(q, k, v, mask, name=function, same_length=True)
  registry.check_arguments(mechanism, function, form=form, chunk_size=chunk_size)
  b, n, h, dk = k.shape
  gates = {**gates, 'initial_state': (initial_state, ((b, v.shape[2], dk, v.shape[3]),))}
  for name, (x, shapes) in gates.items():
    if x is not None and tuple(x.shape) not in shapes:
      raise ValueError(
        f'{function}: {name} of shape {tuple(x.shape)} does not fit q '
        f'{tuple(q.shape)}; valid: {" or ".join(map(str, map(list, shapes)))}'
      )
  real = masking.key_padding_from_mask(mask, b, n)
  if segment_ids is not None:
    segment_ids = segments.check(segment_ids, b, n, function)
    if real is not None:
      segment_ids = jnp.where(real, segment_ids, 0)
    real = segment_ids != 0
  return PureCall(real, segment_ids)


def pure_recurrence(
  cores: gated.Cores,
  q,
  k,
  v,
  g=None,
  beta=None,
  *,
  call: PureCall,
  form: str = 'chunk',
  chunk_size: int = 64,
  initial_state=None,
):
  """(out `[b, n, h, dv]`, final state `[b, h, dk, dv]`), float32 (float64 where an input
  is), of the recurrence `cores` ('chunk': chunkwise; 'naive': token by token, the
  definition) on its inputs (shapes as `gated.scan_tokens`), from `initial_state` (None:
  zeros). A padded token (`call.real` False) neither writes to the state nor decays it;
  its output is 0; `call.segment_ids` confine each token to its document.

  The pure functions' arguments for packed rows and streaming (fla's names):
    segment_ids: optional `[batch, length]` int, a packed row (docs/design.md,
      "Documents"): a run of equal non-zero ids is a document, each token reads only its
      own document (the state starts again at each), and 0 is padding.
    initial_state: optional S `[batch, heads, dk, dv]` the row's first document continues
      (None: zeros), e.g. the final state of the call on the tokens before.
    return_final_state: also return the state after the last real token (its document's),
      so that a sequence streamed in pieces equals one call."""
  q, k, v, g, beta = documents.zero_padding(call.real, q, k, v, g, beta)
  core = cores.chunked if form == 'chunk' else cores.scan
  return core(
    q,
    k,
    v,
    g,
    beta,
    initial_state=initial_state,
    segment_ids=call.segment_ids,
    chunk_size=chunk_size,
  )


def finished(out, state, dtype, return_final_state: bool):
  """A pure function's result: out in `dtype`, with the final state if asked."""
  out = out.astype(dtype)
  return (out, state) if return_final_state else out


class RecurrentState(NamedTuple):
  """A gated recurrence's decoding state: S `[batch, heads, dk, dv]`, the short
  convolution's last K - 1 inputs (q, k, v), each `[batch, K - 1, heads, d]` (q and k
  `[batch, K - 1, qk_heads, dk]` where heads share query/key groups; empty without
  it), and `segment` `[batch]` int32, the segment id of the last real token (0: none yet;
  a decoding step with another id starts a new document). Constant size."""

  s: jnp.ndarray
  conv: Tuple[jnp.ndarray, ...]
  segment: Optional[jnp.ndarray] = None


class GatedRecurrence(registry.Mechanism):
  """The declaration the gated linear attentions share (not registered itself).

  A subclass sets `cores` (`gated.DECAY` or `delta.DELTA`), `activation` ('silu': applied
  to q, k, v after the short convolution) and implements:
    recurrence_inputs(options, params, q, k, v, gates) -> (q, k, v, log_decay, beta): the
      recurrence's inputs from the convolved q, k, v `[b, n, h, d]` and the gates
      (log_decay `[b, n, h, 1 or dk]`, None for no decay; beta `[b, n, h]` or None);
    finish(options, params, out, v, gates) -> the output `[b, n, h, dv]` from the
      recurrence's (norm, output gate);
    run_pure_function(q, k, v, gates, params, **kwargs) -> its pure function's output on
      the recurrence's q, k, v and its layer's gates and parameters (the registry-wide
      tests call it);
    skip(options, params, v), optional -> the term the output adds beside the recurrence's
      (Mamba-2's D v; 0.0 by default);
    own_params(options, heads, head_dim), and `input_params` / `gates` as the registry says.
  A subclass may declare other head shapes (`head_shapes`; `qk_heads` for query/key
  groups shared by several heads): the short convolution then runs on q and k as
  projected (`[K, qk_heads, qk_dim]` kernels), and q and k are repeated to the value
  heads after it, before the recurrence.
  """

  causal = True
  causal_only = True
  reads_input = True
  masks = 'key_padding'
  decode = 'recurrent'
  cores: gated.Cores = gated.DECAY
  activation: str = ''  # '' or 'silu'
  sequence_parallel = 'decayed_state'
  # Packed rows in the XLA chunk form, the Pallas kernels, the token scan, the decoding
  # step and the split layer.
  segments = True
  # (core, q, k, v, g, beta, *, segment_ids, chunk_size, axis) -> out: the recurrence on one
  # device's block (`attend_sharded`), `gated.decayed_sharded` or `delta.transition_sharded`.
  sharded_recurrence: Any = staticmethod(gated.decayed_sharded)

  def own_params(self, options, *, heads, head_dim):
    del options, heads, head_dim
    return {}

  def qk_heads(self, options, heads: int) -> int:
    """Query/key heads for `heads` heads (default: one each; a divisor: shared groups)."""
    del options
    return heads

  @staticmethod
  def init_for(options, default):
    """The initialiser of a convolution or gate projection: `default` or, with init='fla',
    `initializers.fla_init`."""
    return initializers.fla_init if options.init == 'fla' else default

  def params(self, options, *, heads, head_dim, max_length, causal):
    qk_heads, qk_dim, v_dim = self.head_shapes(options, heads=heads, head_dim=head_dim)
    shapes = {'q': (qk_heads, qk_dim), 'k': (qk_heads, qk_dim), 'v': (heads, v_dim)}
    specs = {}
    for name in ('q', 'k', 'v') if options.conv_size else ():
      specs[f'{name}_conv'] = registry.ParamSpec(
        (options.conv_size,) + shapes[name], self.init_for(options, initializers.conv_init)
      )
      if options.conv_bias:
        bias_init = (
          initializers.zeros_init
          if options.init == 'fla'
          else initializers.conv_bias_init(options.conv_size)
        )
        specs[f'{name}_conv_bias'] = registry.ParamSpec(shapes[name], bias_init)
    specs.update(self.own_params(options, heads=heads, head_dim=head_dim))
    return specs

  def recurrence_inputs(self, options, params, q, k, v, gates):
    raise NotImplementedError

  def finish(self, options, params, out, v, gates):
    raise NotImplementedError

  def run_pure_function(self, q, k, v, gates, params, **kwargs):
    """The mechanism's pure function (`efficient_attn.mechanisms`) on the recurrence's q,
    k, v `[b, n, h, d]`, the gates of its layer (`gates`) and the parameters it reads
    (`params`); kwargs: mask, form, chunk_size."""
    raise NotImplementedError

  def conv_inputs(self, options, q, k, v, gates):
    """q, k, v `[b, n, heads, d]` as the short convolution reads them, from the projected
    heads and the (padding-zeroed) gates; default: as projected (Gated DeltaProduct appends
    its further steps' keys and values to k's and v's features)."""
    del options, gates
    return q, k, v

  def skip(self, options, params, v):
    """The term the output adds beside the recurrence's, before the output norm and gate
    (Mamba-2's D v), as the pure function does: `[b, n, h, dv]`, or 0.0 (none)."""
    del options, params, v
    return 0.0

  def _features(self, options, params, q, k, v, axis=None, segment_ids=None):
    """The short convolution (each tap within its token's document where `segment_ids` is
    given; with the sequence split over `axis`, each block reads the previous device's
    last conv_size - 1 tokens, `collectives.halo_before`, and their ids), then the
    activation; float32 (float64 where an input is)."""
    if options.conv_size:
      halo = options.conv_size - 1

      def conv(x, n):
        w, b = params[f'{n}_conv'], params.get(f'{n}_conv_bias')
        if axis is None:
          return short_conv.causal_conv(x, w, b, segment_ids=segment_ids)
        ids = segment_ids
        if ids is not None:
          ids = jnp.concatenate([collectives.halo_before(ids, halo, axis), ids], 1)
        x = jnp.concatenate([collectives.halo_before(x, halo, axis), x], 1)
        return short_conv.causal_conv(x, w, b, segment_ids=ids)[:, halo:]

      q, k, v = (conv(x, n) for x, n in zip((q, k, v), 'qkv'))
    return self._activate(q, k, v)

  def _activate(self, *xs):
    xs = tuple(upcast(x) for x in xs)
    return tuple(jax.nn.silu(x) for x in xs) if self.activation == 'silu' else xs

  @staticmethod
  def _to_heads(q, k, heads: int):
    """q, k `[b, n, qk_heads, dk]` repeated to `heads` (head i reads group i // (heads /
    qk_heads), as Mamba-2's ngroups)."""
    return tuple(jnp.repeat(x, heads // x.shape[2], axis=2) for x in (q, k))

  def _inputs(self, options, params, q, k, v, *, mask, causal, ctx, axis=None):
    """(q, k, v, log-decay, beta, gates, segment ids) of the recurrence from the projected
    heads: key padding checked, the short convolution and activation (`_features`), groups
    repeated to the heads, the mechanism's gates (`recurrence_inputs`). A padded token's
    inputs and gates are 0 (by `where`, so a NaN there reaches nothing): it neither writes
    to the state nor decays it, and its output is 0. The segment ids (None without
    `ctx.documents`) are `ctx.documents` with the padding at 0 (`documents.as_segment_ids`).
    In a bfloat16 layer q, k and v go back to bfloat16, so the chunk form's matrix
    products run in bfloat16 with float32 accumulation and state."""
    if not causal:
      raise ValueError(f'mechanism {self.name!r} is causal only: call it with causal=True')
    dtype = v.dtype
    k, v, kp = masking.checked_keys_values(
      q,
      k,
      v,
      mask,
      name=f'mechanism {self.name!r}',
      causal=True,
      qk_groups=self.qk_heads(options, v.shape[2]) != v.shape[2],
    )
    q = masking.zero_padded(q, kp)  # a padded token feeds no convolution either
    gates = jax.tree.map(lambda x: masking.zero_padded(x, kp), ctx.gates)
    ids = None
    if ctx.documents is not None:
      ids = documents.as_segment_ids(segments.check(ctx.documents, *v.shape[:2], self.name), kp)
    q, k, v = self.conv_inputs(options, q, k, v, gates)
    q, k, v = self._features(options, params, q, k, v, axis, ids)
    q, k = self._to_heads(q, k, v.shape[2])
    q, k, v, g, beta = self.recurrence_inputs(options, params, q, k, v, gates)
    q, k, v, g, beta = documents.zero_padding(kp, q, k, v, g, beta)
    if jnp.dtype(dtype) == jnp.bfloat16:
      q, k, v = (x.astype(dtype) for x in (q, k, v))
    return q, k, v, g, beta, gates, ids

  def attend(self, options, params, q, k, v, *, mask, causal, ctx):
    dtype = v.dtype
    q, k, v, g, beta, gates, ids = self._inputs(
      options, params, q, k, v, mask=mask, causal=causal, ctx=ctx
    )
    core = self.core(options, q.dtype, packed=ids is not None)
    out, _ = core(q, k, v, g, beta, segment_ids=ids, chunk_size=options.chunk_size)
    return self.finish(options, params, out, v, gates).astype(dtype)

  def core(self, options, dtype, packed: bool = False):
    """The recurrence's form for a call with q, k, v of `dtype`: the Pallas kernels where
    `options.implementation` resolves to 'pallas' (`kernels.choose`, once per call), else the
    chunk form or, with form='naive', the token recurrence. Packed rows (`packed`) run in
    either: the kernels take segment ids as the XLA forms do."""
    del packed  # every form takes segment ids
    choice = kernels.choose(options.implementation, form=options.form, dtype=dtype)
    if choice == 'pallas':
      return self.cores.pallas
    return self.cores.chunked if options.form == 'chunk' else self.cores.scan

  def attend_sharded(self, options, params, q, k, v, *, mask, causal, ctx, axis):
    """`attend` on one device's block (`efficient_attn.layers.parallel`): the short convolution
    reads the previous device's last conv_size - 1 tokens, and `sharded_recurrence` brings
    in the state of the blocks before; the core is attend's (the Pallas kernels where
    `implementation` resolves to 'pallas'). `ctx.documents` is this block of the row's
    document index: a document that crosses a device boundary continues there."""
    dtype = v.dtype
    q, k, v, g, beta, gates, ids = self._inputs(
      options, params, q, k, v, mask=mask, causal=causal, ctx=ctx, axis=axis
    )
    out = self.sharded_recurrence(
      self.core(options, q.dtype, packed=ids is not None),
      q,
      k,
      v,
      g,
      beta,
      segment_ids=ids,
      chunk_size=options.chunk_size,
      axis=axis,
    )
    return self.finish(options, params, out, v, gates).astype(dtype)

  def init_state(self, options, *, batch, heads, head_dim, v_dim):
    qk_heads = self.qk_heads(options, heads)
    conv = (
      tuple(
        jnp.zeros((batch, options.conv_size - 1, h, d), F32)
        for h, d in ((qk_heads, head_dim), (qk_heads, head_dim), (heads, v_dim))
      )
      if options.conv_size
      else ()
    )
    segment = jnp.zeros((batch,), jnp.int32)
    return RecurrentState(self.cores.init(batch, heads, head_dim, v_dim), conv, segment)

  def step_documents(self, state, inputs, ctx):
    """A decoding step's documents: (segment, S, real, reset, inputs, gates). `ctx.documents`
    `[batch, 1]` (None: one document): a real token whose id differs from `state.segment`
    (when that is not 0) starts a new document (`reset` `[batch]`, S cleared); a padding
    token (`real` False) has its inputs and gates zeroed. `real` and `reset` are None
    without documents."""
    batch = inputs[0].shape[0]
    segment = jnp.zeros((batch,), jnp.int32) if state.segment is None else state.segment
    s, real, reset = state.s, None, None
    gates = ctx.gates
    if ctx.documents is not None:
      real, reset, segment = documents.token_documents(ctx.documents, segment, self.name)
      s = documents.where_rows(~reset, s)
      inputs = documents.zero_padding(real[:, None], *inputs)
      gates = jax.tree.map(lambda x: documents.zero_padding(real[:, None], x)[0], gates)
    return segment, s, real, reset, tuple(inputs), gates

  def step(self, options, params, state, q_t, k_t, v_t, *, ctx):
    """One token. `ctx.documents` `[batch, 1]`: the token's segment id (0: padding; None:
    one document): a real token whose id differs from `state.segment` (when that is not 0)
    starts a new document, clearing S and the convolution's history first; a padding token
    changes nothing and its output is 0. The state keeps its dtypes."""
    dtype = v_t.dtype
    conv = state.conv
    segment, s, real, reset, (q_t, k_t, v_t), gates = self.step_documents(
      state, (q_t, k_t, v_t), ctx
    )
    q_t, k_t, v_t = self.conv_inputs(options, q_t, k_t, v_t, gates)
    if options.conv_size:
      steps = [
        short_conv.causal_conv_step(
          hist, x, params[f'{n}_conv'], params.get(f'{n}_conv_bias'), reset=reset, real=real
        )
        for hist, x, n in zip(state.conv, (q_t, k_t, v_t), 'qkv')
      ]
      conv = tuple(h.astype(old.dtype) for (h, _), old in zip(steps, state.conv))
      q_t, k_t, v_t = (y for _, y in steps)
    q_t, k_t, v_t = self._activate(q_t, k_t, v_t)
    q_t, k_t = self._to_heads(q_t, k_t, v_t.shape[2])
    q_t, k_t, v_t, g, beta = self.recurrence_inputs(options, params, q_t, k_t, v_t, gates)
    if real is not None:
      q_t, k_t, v_t, g, beta = documents.zero_padding(real[:, None], q_t, k_t, v_t, g, beta)
    s_new, out = self.cores.step(
      s, q_t[:, 0], k_t[:, 0], v_t[:, 0], *(None if x is None else x[:, 0] for x in (g, beta))
    )
    out = self.finish(options, params, out[:, None], v_t, gates).astype(dtype)
    return RecurrentState(s_new.astype(state.s.dtype), conv, segment), out

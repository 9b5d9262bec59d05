"""What a mechanism declares: its options, parameters, forms and functions (the example of
a declaration is in `efficient_attn.registry`'s docstring).

This module holds the classes a declaration is made of (`Option`, `Options`, `ParamSpec`,
`Mechanism`) and what a layer hands a mechanism when it runs it (`Context`);
`efficient_attn.registry` holds the table of registered declarations and its look-ups,
and re-exports these names (`registry.Mechanism`, `registry.Option`, ...), the ones a
mechanism's file uses.
"""

import copy
import dataclasses
import math
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple, cast

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import scaled_dot_product

MASKS = ('any', 'key_padding')
DECODE_FORMS = ('', 'kv_cache', 'recurrent')
ROTARY_FORMS = ('', 'scores', 'features')
SEQUENCE_FORMS = ('', 'ring', 'prefix_state', 'decayed_state', 'transition', 'halo')
_TYPE_NAMES = {int: 'an int', float: 'a float', bool: 'a bool', str: 'a string'}


@dataclasses.dataclass(frozen=True)
class Option:
  """One mechanism option: its default (what the library and the configs use),
  type and allowed values.

  Attributes:
    name: the keyword, e.g. 'num_landmarks'.
    default: the default value.
    type: int, float, bool or str (an int is accepted for a float).
    doc: one line for docs and errors.
    minimum, maximum: inclusive bounds (numbers).
    above: exclusive lower bound (numbers), e.g. 0.0 for "> 0".
    choices: the allowed values (strings).
    allow_none: None is allowed (it means 'automatic'; the doc says what).
    configurable: settable from an experiment config (False for array-valued
      options such as a shared projection, which only Python callers pass).
  """

  name: str
  default: Any
  type: type
  doc: str
  minimum: Optional[float] = None
  maximum: Optional[float] = None
  above: Optional[float] = None
  choices: Tuple[Any, ...] = ()
  allow_none: bool = False
  configurable: bool = True

  def describe(self) -> str:
    """What the option accepts, e.g. "an int >= 1" or "one of 'elu', 'relu'"."""
    if self.choices:
      text = 'one of ' + ', '.join(repr(c) for c in self.choices)
    elif not self.configurable:
      text = 'an array'
    else:
      text = _TYPE_NAMES.get(self.type, self.type.__name__)
      text = 'a finite ' + text[2:] if self.type is float and text.startswith('a ') else text
      bounds = []
      if self.above is not None:
        bounds.append(f'> {self.above}')
      if self.minimum is not None:
        bounds.append(f'>= {self.minimum}')
      if self.maximum is not None:
        bounds.append(f'<= {self.maximum}')
      if bounds:
        text += ' ' + ' and '.join(bounds)
    return text + (' or None' if self.allow_none else '')

  def check(self, value: Any, mechanism: str) -> Any:
    """`value` converted to the option's type, or ValueError naming it and what is allowed."""

    def bad():
      return ValueError(
        f'option {self.name}={value!r} of mechanism {mechanism!r} is not '
        f'valid; it must be {self.describe()}'
      )

    if value is None:
      if self.allow_none:
        return None
      raise bad()
    if not self.configurable:
      return value
    if self.type is float and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    if not isinstance(value, self.type) or (self.type is not bool and isinstance(value, bool)):
      raise bad()
    if self.out_of_range(value) or (self.type is float and not math.isfinite(cast(float, value))):
      raise bad()
    return value

  def out_of_range(self, value: Any) -> bool:
    """`value` (not None) is outside the declared choices or bounds."""
    return bool(
      (self.choices and value not in self.choices)
      or (self.minimum is not None and value < self.minimum)
      or (self.maximum is not None and value > self.maximum)
      or (self.above is not None and value <= self.above)
    )


class Options(dict):
  """Resolved options of one mechanism: a dict with attribute access (`o.num_landmarks`)."""

  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError:
      raise AttributeError(name) from None


class ParamSpec(NamedTuple):
  """A parameter a mechanism owns: its shape and initialiser `init(key, shape, dtype)`.

  A plain `(shape, init)` tuple works wherever a ParamSpec does.
  """

  shape: Tuple[int, ...]
  init: Callable[..., Any]


class Mechanism:
  """A mechanism's declaration; subclass it in the mechanism's own file and `register` it.

  Class attributes (the facts every other part of the project reads):
    name: registry name, e.g. 'nystrom'.
    description: one line for listings.
    citation: the paper, by authors and year.
    options: the `Option`s, with the defaults the library and configs use.
    causal: has a causal form (`causal=True` honoured with no look-ahead).
    causal_only: causal by nature (a recurrence along the sequence, e.g. the
      gated linear attentions; a gate summed along it, Forgetting Attention; a
      causal selection of the past, MoBA and NSA): `configure` refuses causal=False, and a model
      encoder runs it causally.
    reads_input: its gates are functions of each token's layer input, not only
      of q, k and v (e.g. GLA's decay, Mamba-2's dt, DeltaNet's beta): the
      layers create `input_params` and pass `gates(options, params, inputs)` to
      `attend` and `step` as `ctx.gates`.
    fixed_length: has length-shaped parameters and needs `max_length`.
    masks: 'any' (any boolean mask) or 'key_padding' (only key padding; the
      layer refuses other masks rather than silently dropping them).
    decode: '' (cannot decode), 'kv_cache' (exact attention over a key/value
      cache) or 'recurrent' (a constant-size state, `init_state` / `step`).
    state_capacity: its 'recurrent' state holds every token (a key/value cache the
      mechanism keeps itself, e.g. Forgetting Attention's with each key's forget sum):
      `init_state` also takes `capacity` (the longest stream) and `dtype` (the layer's).
    rotary: how rotary positions (Su et al. 2021) apply: 'scores' (the layer
      rotates q and k before `attend`), 'features' (`attend` / `step` rotate the
      kernel features of the numerator, reading `ctx.positions` / `ctx.position`)
      or '' (no q . k scores to rotate: the layer refuses rotary=True).
    forms_weights: forms the attention matrix (attention dropout, sow_weights).
    random_features: uses a fixed random draw (so it is not parameter-free).
    shared_qk: keys are the queries (the layer skips the key projection).
    self_attention_only: needs q_length == kv_length.
    complexity: (time, memory) per head, e.g. ('O(n^2 d)', 'O(n^2)').
    knob: the approximation knob (option, values) the error benchmark sweeps;
      'n' stands for the sequence length and '2n' for twice it.
    example: small options for smoke runs at length 16 (tests, quick benchmarks).
    sequence_parallel: how `attend` runs with the sequence split over a mesh axis
      (context parallelism, `attend_sharded`): '' (it cannot: `whole_sequence`
      says why), 'ring' (exact softmax: key/value blocks passed around the ring
      with an online softmax), 'prefix_state' (linear, Performer, RFA: each block's
      state summary, an exclusive scan over the devices), 'decayed_state' (retention,
      GLA, Mamba-2: the same with each block's total decay), 'transition' (DeltaNet,
      Gated DeltaNet: each block's state transition, composed over the devices) or
      'halo' (local attention: the previous block's last tokens).
    whole_sequence: why a mechanism with sequence_parallel='' needs the whole
      sequence on one device, for the one-line refusal (e.g. "its landmarks are
      means over the whole sequence").
    segments: every form of `attend` (and `step`, `prefill`, `attend_sharded`, the
      kernels) honours packed rows: `ctx.documents` (`ops.segments.document_index` of the
      layer's `segment_ids`; the raw ids in a decoding call) confines each token to its
      own document, exactly (docs/design.md, "Documents"). The layers refuse
      `segment_ids` for a mechanism without it, in one line naming `no_segments`.
    no_segments: why a mechanism with segments=False cannot honour them, for the
      one-line refusal (e.g. "its landmarks are means over the whole row").

  Methods take the resolved `Options` options; `attend` is the mechanism itself.
  `head_shapes` declares the per-head widths the layers project to (default:
  q, k and v of `heads` heads of `head_dim`, head_dim = qkv_features / heads).
  """

  name: str = ''
  description: str = ''
  citation: str = ''
  options: Tuple[Option, ...] = ()
  causal: bool = False
  causal_only: bool = False
  reads_input: bool = False
  fixed_length: bool = False
  masks: str = 'key_padding'
  decode: str = ''
  state_capacity: bool = False
  rotary: str = ''
  forms_weights: bool = False
  random_features: bool = False
  shared_qk: bool = False
  self_attention_only: bool = False
  complexity: Tuple[str, str] = ('', '')
  knob: Optional[Tuple[str, Tuple[Any, ...]]] = None
  example: Mapping[str, Any] = {}
  sequence_parallel: str = ''
  whole_sequence: str = 'it mixes tokens across the whole sequence'
  segments: bool = False
  no_segments: str = 'it has no form that keeps packed documents apart yet'

  @property
  def parameter_free(self) -> bool:
    """No parameters and no random draw with the default options: usable as an attention_fn."""
    if self.fixed_length or self.random_features or self.reads_input:
      return False
    return not self.params(self.resolve(), heads=1, head_dim=1, max_length=None, causal=False)

  def describe(self) -> str:
    """A few lines for a person: what it is, its forms and its options with their defaults."""
    forms = [
      f'causal form: {"only" if self.causal_only else "yes" if self.causal else "no"}',
      f'masks: {"any" if self.masks == "any" else "key padding only"}',
      f'decoding: {self.decode or "none"}',
      f'rotary: {self.rotary or "no"}',
      f'fixed length: {"yes" if self.fixed_length else "no"}',
    ]
    if self.reads_input:
      forms.append('gates from the layer input')
    lines = [
      f'{self.name}: {self.description} ({self.citation})',
      f'  time {self.complexity[0]}, memory {self.complexity[1]} per head; ' + ', '.join(forms),
    ]
    lines += [
      f'  {options.name}={options.default!r}: {options.doc} ({options.describe()})'
      for options in self.options
    ]
    return '\n'.join(lines)

  def resolve(self, options: Optional[Mapping[str, Any]] = None) -> Options:
    """The options with defaults filled in and every value checked."""
    options = dict(options or {})
    known = {opt.name: opt for opt in self.options}
    unknown = sorted(set(options) - set(known))
    if unknown:
      raise ValueError(
        f'unknown option(s) {unknown} for mechanism {self.name!r}; valid '
        f'options: {", ".join(known) or "(none)"}'
      )
    resolved = Options(
      {name: opt.check(options.get(name, opt.default), self.name) for name, opt in known.items()}
    )
    self.check_options(resolved)
    return resolved

  def check_options(self, options: Options) -> None:
    """Raises ValueError for options that are each valid but not together (default: none)."""
    del options

  def check(
    self, options: Options, *, length: int, max_length: Optional[int], causal: bool
  ) -> None:
    """Raises ValueError when the options cannot serve this length (default: nothing to check)."""
    del options, length, max_length, causal

  def params(
    self, options: Options, *, heads: int, head_dim: int, max_length: Optional[int], causal: bool
  ) -> Dict[str, ParamSpec]:
    """The parameters of one layer, by name (default: none)."""
    del options, heads, head_dim, max_length, causal
    return {}

  def head_shapes(self, options: Options, *, heads: int, head_dim: int) -> Tuple[int, int, int]:
    """(qk_heads, qk_dim, v_dim): the shapes the layers project to for `heads` heads of
    `head_dim` (qkv_features / heads).

    Queries and keys get qk_heads heads (a divisor of heads: one query and key per
    group, shared by heads / qk_heads heads, e.g. Mamba-2's ngroups) of qk_dim features;
    values get heads heads of v_dim (e.g. RetNet's values, twice the key width); the
    output projection reads `[heads, v_dim]`, and `attend` returns it. `params`,
    `input_params` and `init_state` read the same layout. Default: (heads, head_dim,
    head_dim). The layers refuse a layout their projection scheme cannot build (see
    `layer.head_layout`).
    """
    del options
    return heads, head_dim, head_dim

  def input_params(
    self, options: Options, *, features: int, heads: int, head_dim: int
  ) -> Dict[str, ParamSpec]:
    """Parameters that read the layer input `[batch, length, features]` (reads_input:
    the gate projections; default: none). They live beside `params`, under the same
    module."""
    del options, features, heads, head_dim
    return {}

  def gates(self, options: Options, params: Mapping[str, Any], inputs):
    """reads_input: the per-token gates, a pytree of `[batch, length, ...]` arrays, from the
    layer input `[batch, length, features]` (one token `[batch, 1, features]` in a decoding
    step) and the declared parameters. The layers pass them as `ctx.gates`."""
    raise NotImplementedError

  def shared_params(
    self, options: Options, *, heads: int, head_dim: int, max_length: Optional[int]
  ) -> Dict[str, ParamSpec]:
    """Parameters one model shares across all its layers (default: none)."""
    del options, heads, head_dim, max_length
    return {}

  def attend(
    self,
    options: Options,
    params: Mapping[str, Any],
    q,
    k,
    v,
    *,
    mask,
    causal: bool,
    ctx: 'Context',
  ):
    """q `[b, lq, h, d]`, k `[b, lk, h, d]`, v `[b, lk, h, dv]` -> `[b, lq, h, dv]` (q and k
    with qk_heads heads of `head_shapes` where it declares fewer)."""
    raise NotImplementedError

  # What it approximates (the approximation-error benchmark and identity tests).
  def attend_sharded(
    self,
    options: Options,
    params: Mapping[str, Any],
    q,
    k,
    v,
    *,
    mask,
    causal: bool,
    ctx: 'Context',
    axis: str,
  ):
    """`attend` on one device's block of the sequence, inside `jax.shard_map` over the
    mesh axis `axis` (context parallelism; `efficient_attn.layers.parallel` runs it).

    q, k, v are this device's blocks `[batch, length / devices, heads, d]` (device i holds
    tokens i * block .. (i + 1) * block - 1), `mask` the block of the key padding
    `[batch, length / devices]` (True = a real token) or None, `ctx.gates` the block of
    the gates. Returns this block of `attend`'s output. Declared by `sequence_parallel`;
    a mechanism without it refuses (`efficient_attn.layers.parallel.check`).
    """
    del options, params, q, k, v, mask, causal, ctx
    raise ValueError(
      f'mechanism {self.name!r} cannot split the sequence over mesh axis '
      f'{axis!r}: {self.whole_sequence}'
    )

  def reference(self, options: Options, q, k, v):
    """The exact attention this mechanism approximates (default: softmax attention)."""
    del options
    return scaled_dot_product.softmax_attention(q, k, v)

  def exact_options(self, length: int) -> Optional[Dict[str, Any]]:
    """Options under which `attend` equals `reference` at this length, or None."""
    del length
    return None

  # Recurrent decoding (decode == 'recurrent').
  def init_state(self, options: Options, *, batch: int, heads: int, head_dim: int, v_dim: int):
    """The empty decoding state (a pytree of constant size, float32) for `heads` heads,
    queries and keys of head_dim features (qk_dim of `head_shapes`) and values of v_dim."""
    raise NotImplementedError

  def step(self, options: Options, params, state, q_t, k_t, v_t, *, ctx: 'Context'):
    """One token `[batch, 1, heads, dim]`: (new state, out_t `[batch, 1, heads, dv]`).

    Feeding tokens 0..n-1 reproduces the causal `attend`. A packed stream (`segments`):
    `ctx.documents` holds the token's raw segment id `[batch, 1]` (0: padding; None: the
    row's one document goes on); a row whose id differs from its last real token's
    starts a new document, and the mechanism resets its state there (it keeps the last
    id in its state); a padding token leaves the state as it was and its output is 0.
    """
    raise NotImplementedError

  def prefill(self, options: Options, params, state, q, k, v, *, ctx: 'Context'):
    """n tokens `[batch, n, heads, dim]` from `state`: (the state after them, out `[batch,
    n, heads, dv]`), as n `step`s would give them (a prompt run in one call).

    `ctx` is a step's for n tokens: `ctx.gates` `[batch, n, ...]`, `ctx.documents` the raw
    segment ids `[batch, n]` (or None), `ctx.position` the rotary positions `[batch, n]`
    (or None; `ctx.positions` the same pair for a parallel form). Default: `step` over the
    tokens in a `lax.scan` (exact, n sequential steps); a mechanism with a parallel form
    from an initial state (a chunk form with `initial_state`, returning its final state)
    overrides it with one pass.
    """
    per_token = lambda x: None if x is None else jnp.moveaxis(x, 1, 0)[:, :, None]

    def body(state, token):
      q_t, k_t, v_t, gates, documents, position = token
      one = copy.copy(ctx)
      one.gates, one.documents, one.position = gates, documents, position
      one.positions = None if position is None else (position, position)
      return self.step(options, params, state, q_t, k_t, v_t, ctx=one)

    position = ctx.position
    if position is not None and jnp.ndim(position) < 2:  # one position for every row
      position = jnp.broadcast_to(position + jnp.arange(q.shape[1]), q.shape[:2])
    tokens = jax.tree.map(per_token, (q, k, v, ctx.gates, ctx.documents, position))
    state, out = lax.scan(body, state, tokens)
    return state, jnp.moveaxis(out[:, :, 0], 0, 1)

  def grouped_state(self, options: Options) -> bool:
    """The state depends on keys and values alone (no per-query-head parameter touches
    them), so with grouped-query attention `step` keeps one state per key/value head and
    takes q_t `[batch, 1, heads, dk]` with k_t, v_t `[batch, 1, kv_heads, d]`."""
    del options
    return False

  # KV-cache decoding (decode == 'kv_cache').
  def kv_window(self, options: Options) -> Optional[int]:
    """Causal window of the key/value cache (None: every earlier key)."""
    del options
    return None

  def kv_cache_attention(self, options: Options) -> Optional[Callable[..., Any]]:
    """The attention of a decoding call's queries over its full key/value cache, with
    `layers.decoding.kv_cache_attention`'s arguments, or None: that function, exact softmax
    (default; e.g. MoBA selects blocks of the cache instead)."""
    del options
    return None


class Context:
  """What a mechanism may ask of the layer that runs it (Linen or NNX, or a bare call).

  Attributes:
    deterministic: evaluation: no dropout and no training-only noise.
    tag: names this layer (a module path): fixed random draws are keyed by it,
      so each layer has its own draw, the same in every call and process.
    dropout_rate, broadcast_dropout: attention-weight dropout (mechanisms that
      form the weights apply it when not deterministic).
    max_length: the layer's context length (None if it has none).
    positions: rotary (query positions, key positions) for a 'features'
      mechanism's `attend`, each `[length]` or `[batch, length]` (a packed row's restart
      at each document), or None (no rotary positions).
    position: a decoding call's rotary positions (`[batch, n]`, n = 1 in a step, or a
      scalar), or None.
    gates: a reads_input mechanism's `Mechanism.gates` of this call's layer
      input (`[batch, q_length, ...]`, one token in a step), else None.
    documents: in `attend` (and `attend_sharded`, on the block), `[batch, length]` int32,
      the document of each token of a packed row (`ops.segments.document_index` of the
      layer's `segment_ids`), for a mechanism that declares `segments`; None for rows of
      one document. Padding is the call's key padding (`mask`). In a decoding call
      (`step`, `prefill`): the tokens' raw segment ids `[batch, n]` (0: padding), or None
      (see `Mechanism.step`).
    forming_weights: the call computes the attention weights themselves
      (`layer.attention_weights`, identity values), so a mechanism must use its
      explicit form, never a fused kernel that does not form them.
  """

  def __init__(
    self,
    deterministic: bool = True,
    tag: Tuple[str, ...] = (),
    rngs: Optional[Mapping[str, Any]] = None,
    dropout_rate: float = 0.0,
    broadcast_dropout: bool = True,
    max_length: Optional[int] = None,
  ):
    self.deterministic = deterministic
    self.tag = tuple(tag)
    self.max_length = max_length
    self.dropout_rate = dropout_rate
    self.broadcast_dropout = broadcast_dropout
    self._rngs = dict(rngs or {})
    self.positions = None
    self.position = None
    self.gates = None
    self.documents = None
    self.forming_weights = False

  def rng(self, name: str):
    """A PRNG key from the stream `name` ('dropout', 'features', ...), or None if absent."""
    return self._rngs.get(name)

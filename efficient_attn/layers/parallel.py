"""Context parallelism: one sequence split over a mesh axis.

    layer = ea.MultiHeadAttention(num_heads=8, mechanism='gla', causal=True,
                                  sequence_axis='sequence')
    with jax.set_mesh(mesh):                  # a mesh with an axis 'sequence'
      y = layer.apply(variables, x)           # x [batch, length, features]

A layer built with `sequence_axis` runs its mechanism in `jax.shard_map` (`attend`):
device i of the axis holds tokens i * m .. (i + 1) * m - 1 (m = length / devices) of
q, k, v, the key padding and the gates, the batch is split over the mesh's other axes
(where they divide it), and the parameters are replicated. On its block each device
runs the mechanism's `attend_sharded`, which uses the collectives of
`efficient_attn.ops.collectives` (the ring, the exclusive scan of states, the halos).

`check` makes the one-line refusals: a mechanism without a sequence-parallel form
(`registry.Mechanism.whole_sequence` says why), no mesh or no such axis, a length the
axis does not divide, cross-attention, a mask other than key padding, sown attention
weights and attention-weight dropout in training. A decoding step (one token) is not
split: it runs as without a sequence axis.
"""

import math
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from efficient_attn import registry


def supporting() -> Tuple[str, ...]:
  """The mechanisms that can split the sequence (a `sequence_parallel` form)."""
  return registry.names_where(lambda m: bool(m.sequence_parallel))


def check(
  decl: registry.Mechanism,
  *,
  axis: str,
  mesh,
  q_length: int,
  kv_length: int,
  mask=None,
  sow_weights: bool = False,
  dropout_rate: float = 0.0,
  deterministic: bool = True,
) -> int:
  """Refuses, in one line naming the value and the valid ones, what a layer with
  `sequence_axis=axis` cannot run on `mesh` (an `AbstractMesh`, e.g.
  `jax.sharding.get_abstract_mesh()`); returns the number of devices on the axis."""
  if not decl.sequence_parallel:
    raise ValueError(
      f'mechanism {decl.name!r} cannot split the sequence over mesh axis '
      f'{axis!r}: {decl.whole_sequence}; mechanisms that can: '
      f'{", ".join(supporting())}'
    )
  if mesh is None or mesh.empty:
    raise ValueError(
      f'sequence_axis={axis!r} needs a mesh: call the layer inside '
      f'`with jax.set_mesh(mesh):`, with a mesh that has the axis {axis!r}'
    )
  if axis not in mesh.axis_names:
    raise ValueError(
      f'sequence_axis={axis!r} is not an axis of the mesh; valid: '
      f'{", ".join(map(repr, mesh.axis_names))}'
    )
  size = mesh.shape[axis]
  if q_length != kv_length:
    raise ValueError(
      f'sequence_axis={axis!r} splits one sequence (self-attention); got '
      f'q_length={q_length} and kv_length={kv_length}'
    )
  if q_length % size:
    raise ValueError(
      f'sequence length {q_length} is not divisible by the {size} devices of '
      f'mesh axis {axis!r}; pad it to a multiple of {size}'
    )
  if mask is not None and not (
    jnp.ndim(mask) == 2 or (jnp.ndim(mask) == 4 and mask.shape[1] == 1 and mask.shape[2] == 1)
  ):
    raise ValueError(
      f'sequence_axis={axis!r} takes key padding only ([batch, length] or '
      f'[batch, 1, 1, length]), not a mask of shape {tuple(mask.shape)}; '
      f'ask for causality with causal=True'
    )
  if sow_weights:
    raise ValueError(
      f'sow_weights=True with sequence_axis={axis!r}: the attention weights '
      f'[length, length] are never formed on one device; valid: '
      f'sow_weights=False, or sequence_axis=None'
    )
  if dropout_rate > 0.0 and not deterministic:
    raise ValueError(
      f'dropout_rate={dropout_rate} with sequence_axis={axis!r}: '
      f'attention-weight dropout in training is not split over devices; '
      f'valid: dropout_rate=0, or sequence_axis=None'
    )
  return size


# The shard_map wrapper.


class _BlockContext(registry.Context):
  """The layer's `registry.Context` on one device's block: its gates, rotary positions and
  documents (the packed row's document index, global: a document that began on an
  earlier device keeps its index) are the block's, and its random keys were drawn outside
  (a module cannot draw inside `jax.shard_map`)."""

  def __init__(self, ctx: registry.Context, gates, positions, documents, keys):
    super().__init__(
      deterministic=ctx.deterministic,
      tag=ctx.tag,
      dropout_rate=ctx.dropout_rate,
      broadcast_dropout=ctx.broadcast_dropout,
      max_length=ctx.max_length,
    )
    self.gates, self.positions, self._keys = gates, positions, dict(keys)
    self.documents = documents

  def rng(self, name: str):
    return self._keys.get(name)


def _batch_axes(mesh, axis: str, batch: int):
  """The mesh axes the batch is split over: every other axis that is not manual, if
  together they divide the batch (else none: the batch is replicated)."""
  names = tuple(
    a
    for a, t in zip(mesh.axis_names, mesh.axis_types)
    if a != axis and t != jax.sharding.AxisType.Manual and mesh.shape[a] > 1
  )
  if batch % math.prod(mesh.shape[a] for a in names):
    return None
  return names[0] if len(names) == 1 else (names or None)


def _explicit(spec: P, mesh) -> P:
  """`spec` with only the mesh's explicit axes (the part `jax.sharding.reshard` takes)."""
  explicit = {
    a for a, t in zip(mesh.axis_names, mesh.axis_types) if t == jax.sharding.AxisType.Explicit
  }

  def keep(entry):
    names = tuple(a for a in (entry if isinstance(entry, tuple) else (entry,)) if a in explicit)
    return names[0] if len(names) == 1 else (names or None)

  return P(*(keep(e) for e in spec))


def _reshard(x, spec: P, mesh):
  """x resharded to `spec` where the mesh has explicit axes (shard_map takes an explicitly
  sharded input only as its in_specs say); unchanged on an automatic mesh."""
  if x is None or jax.sharding.AxisType.Explicit not in mesh.axis_types:
    return x
  return jax.sharding.reshard(x, _explicit(spec, mesh))


def key_padding_of(mask, batch: int, length: int) -> Optional[jnp.ndarray]:
  """A key padding `[batch, length]` from a `check`ed mask (`[batch, length]` or
  `[batch, 1, 1, length]`), or None."""
  if mask is None:
    return None
  mask = jnp.asarray(mask, bool)
  return jnp.broadcast_to(mask.reshape(mask.shape[0], -1), (batch, length))


def attend(
  decl: registry.Mechanism,
  options: registry.Options,
  params,
  q,
  k,
  v,
  *,
  mask,
  causal: bool,
  ctx: registry.Context,
  axis: str,
):
  """`decl.attend_sharded` on every device's block of the sequence, in `jax.shard_map`
  over the ambient mesh (`check` it first): q `[batch, length, heads, d]`, k, v likewise,
  mask key padding or None -> `[batch, length, heads, dv]`, split and placed as q was."""
  mesh = jax.sharding.get_abstract_mesh()
  b, n = q.shape[:2]
  batch = _batch_axes(mesh, axis, b)
  seq = P(batch, axis)
  kp = key_padding_of(mask, b, n)
  positions = ctx.positions
  streams = ('features',) if options.get('redraw') and not ctx.deterministic else ()
  keys = {name: ctx.rng(name) for name in streams}
  keys = {name: key for name, key in keys.items() if key is not None}

  def body(params, q, k, v, kp, gates, positions, documents, keys):
    block = _BlockContext(ctx, gates, positions, documents, keys)
    return decl.attend_sharded(
      options, params, q, k, v, mask=kp, causal=causal, ctx=block, axis=axis
    )

  # Rotary positions: [length] each (the same for every row) or [batch, length] (a packed
  # row's, restarting at each document).
  position_spec = None
  if positions is not None:
    position_spec = tuple(P(axis) if jnp.ndim(p) == 1 else seq for p in positions)
  replicated = lambda tree: jax.tree.map(lambda x: _reshard(x, P(), mesh), tree)
  split = lambda tree, spec: jax.tree.map(lambda x: _reshard(x, spec, mesh), tree)
  args = (
    replicated(params),
    split(q, seq),
    split(k, seq),
    split(v, seq),
    split(kp, seq),
    split(ctx.gates, seq),
    None if positions is None else tuple(split(p, s) for p, s in zip(positions, position_spec)),
    split(ctx.documents, seq),
    replicated(keys),
  )
  specs = (
    P(),
    seq,
    seq,
    seq,
    seq,
    jax.tree.map(lambda _: seq, ctx.gates),
    position_spec,
    None if ctx.documents is None else seq,
    P(),
  )
  manual = {axis} | set(() if batch is None else (batch,) if isinstance(batch, str) else batch)
  out = jax.shard_map(body, in_specs=specs, out_specs=seq, axis_names=manual, check_vma=False)(
    *args
  )
  if jax.sharding.AxisType.Explicit in mesh.axis_types:
    out = jax.sharding.reshard(out, jax.typeof(q).sharding.spec)
  return out

"""What the recurrence kernels share: the static configuration of a call, the block layout
(XLA side), and small in-kernel helpers written for the rules of both lowerings (Triton:
2-D values, dots of power-of-two tiles >= 16, no slicing of values, so a row or column is
taken by a masked sum; Mosaic: the same code lowers).

Layout. A kernel program sees one (batch, head) row: q, k `[N, DK]`, v `[N, DV]`, the
chunk-local cumulative log-decays b `[N, 1 or DK]`, beta `[N, 1]`, and the documents d
`[N, 1]` of the batch row, with N = n_chunks * C. The chunk form's chunk c
(c = min(chunk_size, n)) is kept exactly: each chunk of c tokens is zero-padded to
C = max(16, next power of two >= c) tokens, and the feature dims to DK, DV = max(16, next
power of two). A padded token has k = v = 0, log-decay 0 and beta 0, so it neither writes
nor decays; the padding only makes every block a legal tile. The log-decays are summed
within each chunk here, in XLA (`chunk_cumsum`), and their gradient summed back by
autodiff of the cumulative sum, so the kernels read b_t <= 0 and every decay factor they
form is exp of a masked difference <= 0.

Documents (docs/design.md, "Documents"; `efficient_attn.ops.segments`). `chunk_documents`
gives each token its document index minus that of the last token before its chunk
(d_t >= 0; the row's first chunk counts from token 0), as float32. In a chunk the kernels
then read (`masks`): the intra-chunk scores `lower & (d_s == d_t)`; the carried state
reaches token t where d_t == 0 (`first`); a token writes the chunk's end state where
d_t == d_C (`last`); the start state survives to the end where d_C == 0 (`keep`). A row
without segment ids has d = 0 everywhere, and every mask is the plain causal one.
"""

import functools
import math
from typing import Any, NamedTuple, Optional

import jax
from jax import lax
from jax.experimental import pallas as pl
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

F32 = jnp.float32
MIN_TILE = 16  # Triton's smallest dot tile
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
PRECISIONS = ('tf32', 'highest')
DECAYS = ('none', 'head', 'feature')


def tile(d: int) -> int:
  """The smallest power of two >= max(d, MIN_TILE)."""
  return max(MIN_TILE, pl.next_power_of_2(int(d)))


class Layout(NamedTuple):
  """The static shape of one call: b, h, n (tokens), c (the chunk form's chunk), C (the
  kernel's padded chunk), nc (chunks), dk, dv and their tiles DK, DV, dg (the width of the
  cumulative log-decays: 0 none, 1 one per head, DK one per key feature)."""

  b: int
  h: int
  n: int
  c: int
  C: int
  nc: int
  dk: int
  dv: int
  DK: int
  DV: int
  dg: int

  @property
  def N(self) -> int:  # pylint: disable=invalid-name
    return self.nc * self.C

  @property
  def rows(self) -> int:
    return self.b * self.h


def layout(q, v, log_decay, chunk_size: int) -> Layout:
  b, n, h, dk = q.shape
  dv = v.shape[-1]
  c = max(1, min(int(chunk_size), n))
  dg = 0 if log_decay is None else log_decay.shape[-1]
  DK = tile(dk)  # pylint: disable=invalid-name
  return Layout(b, h, n, c, tile(c), -(-n // c), dk, dv, DK, tile(dv), DK if dg > 1 else dg)


class Config(NamedTuple):
  """What one compiled kernel depends on (static): the layout, the dots' operand dtype
  (float32 or bfloat16), the decay ('none', 'head', 'feature'), whether it is the delta
  rule, the name, the value tile (columns of v and of the state per program; DV but on a
  GPU), and the float32 dots' precision (a `lax.Precision`, set per platform by the
  driver)."""

  lay: Layout
  dtype: Any
  decay: str
  delta: bool
  name: str
  bv: int
  precision: Any = None


# ----------------------------------------------------------------------------
# Blocks (XLA, outside the kernels).
# ----------------------------------------------------------------------------


def to_blocks(x, lay: Layout, width: int, dtype=None):
  """`[b, n, h, d]` (or `[b, n, h]`, as `[..., 1]`) -> `[b * h, N, width]`, each chunk of c
  tokens zero-padded to C and the features to `width`."""
  if x.ndim == 3:
    x = x[..., None]
  x = jnp.swapaxes(x if dtype is None else x.astype(dtype), 1, 2)  # [b, h, n, d]
  x = jnp.pad(x, [(0, 0), (0, 0), (0, lay.nc * lay.c - lay.n), (0, 0)])
  x = x.reshape(lay.b, lay.h, lay.nc, lay.c, x.shape[-1])
  x = jnp.pad(x, [(0, 0)] * 3 + [(0, lay.C - lay.c), (0, width - x.shape[-1])])
  return x.reshape(lay.rows, lay.N, width)


def from_blocks(y, lay: Layout, d: int):
  """`[b * h, N, D]` -> `[b, n, h, d]`: the inverse of `to_blocks`."""
  y = y.reshape(lay.b, lay.h, lay.nc, lay.C, y.shape[-1])[:, :, :, : lay.c, :d]
  y = y.reshape(lay.b, lay.h, lay.nc * lay.c, d)[:, :, : lay.n]
  return jnp.swapaxes(y, 1, 2)


def chunk_cumsum(log_decay, lay: Layout):
  """Log-decays `[b, n, h, dg]` -> chunk-local inclusive cumulative sums `[b * h, N, dg']`
  (float32; dg' = 1 or DK)."""
  x = to_blocks(log_decay, lay, lay.dg, F32).reshape(lay.rows, lay.nc, lay.C, lay.dg)
  return jnp.cumsum(x, axis=2).reshape(lay.rows, lay.N, lay.dg)


def chunk_documents(documents, lay: Layout):
  """The document index `[b, n]` (`segments.document_index`; None: one document) -> d
  `[b, N, 1]` float32, per batch row (the heads share it): each token's index minus that of
  the last token before its chunk (the first chunk: token 0's), so d >= 0 and d == 0 marks
  the tokens the carried state reaches. Padded tokens repeat the chunk's last index."""
  if documents is None:
    return jnp.zeros((lay.b, lay.N, 1), F32)
  x = jnp.pad(documents.astype(jnp.int32), [(0, 0), (0, lay.nc * lay.c - lay.n)], mode='edge')
  x = x.reshape(lay.b, lay.nc, lay.c)
  before = jnp.concatenate([x[:, :1, :1], x[:, :-1, -1:]], axis=1)  # [b, nc, 1]
  x = jnp.pad(x - before, [(0, 0), (0, 0), (0, lay.C - lay.c)], mode='edge')
  return x.reshape(lay.b, lay.N, 1).astype(F32)


def state_blocks(state, lay: Layout):
  """The initial state `[b, h, dk, dv]` (None: zeros) -> `[b * h, DK, DV]` float32."""
  if state is None:
    return jnp.zeros((lay.rows, lay.DK, lay.DV), F32)
  s = jnp.pad(state.astype(F32), [(0, 0), (0, 0), (0, lay.DK - lay.dk), (0, lay.DV - lay.dv)])
  return s.reshape(lay.rows, lay.DK, lay.DV)


def state_from_blocks(s, lay: Layout):
  return s.reshape(lay.b, lay.h, lay.DK, lay.DV)[:, :, : lay.dk, : lay.dv]


# ----------------------------------------------------------------------------
# In-kernel helpers (values, not refs).
# ----------------------------------------------------------------------------


def dot(a, b, cfg: Config, ta: bool = False, tb: bool = False):
  """a @ b (a^T with ta, b^T with tb) with operands in `cfg.dtype`, float32 accumulation and,
  for float32 operands, `cfg.precision`."""
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  precision = cfg.precision if jnp.dtype(cfg.dtype) == jnp.float32 else None
  return lax.dot_general(
    a.astype(cfg.dtype),
    b.astype(cfg.dtype),
    dims,
    precision=precision,
    preferred_element_type=F32,
  )


def iota(shape, axis: int):
  return lax.broadcasted_iota(jnp.int32, shape, axis)


def row(x, t):
  """Row t of x `[r, d]` as `[1, d]` (a masked sum: Triton cannot slice a value)."""
  return jnp.sum(jnp.where(iota(x.shape, 0) == t, x, 0.0), axis=0, keepdims=True)


def col(x, s):
  """Column s of x `[r, d]` as `[r, 1]`."""
  return jnp.sum(jnp.where(iota(x.shape, 1) == s, x, 0.0), axis=1, keepdims=True)


def last(x):
  """The last row of x `[C, d]`, `[1, d]`."""
  return row(x, x.shape[0] - 1)


def at_last_row(x, value):
  """x `[C, d]` plus `value` `[1, d]` at its last row."""
  return x + jnp.where(iota(x.shape, 0) == x.shape[0] - 1, value, 0.0)


def lower(c: int, strict: bool = False):
  """The causal mask `[c, c]`: s <= t (s < t with strict)."""
  t, s = iota((c, c), 0), iota((c, c), 1)
  return s < t if strict else s <= t


def eye(c: int):
  """The identity `[c, c]` (float32), built from iotas inside the kernel."""
  return jnp.where(iota((c, c), 0) == iota((c, c), 1), 1.0, 0.0).astype(F32)


def decay_matrix(b, mask):
  """exp(b_t - b_s) where mask[t, s], else 0: `[C, C]` from cumulative log-decays b `[C, 1]`
  (masked before exp, so every factor is <= 1)."""
  diff = b - b.T
  return jnp.where(mask, jnp.exp(jnp.where(mask, diff, 0.0)), 0.0)


def feature_sum(x, dg: int):
  """x `[r, d]` summed over features to `[r, 1]` for a per-head decay (dg = 1), else x."""
  return jnp.sum(x, axis=1, keepdims=True) if dg == 1 else x


def scaled(x, *factors):
  """x times each factor that is not None (broadcast)."""
  for f in factors:
    if f is not None:
      x = x * f
  return x


def chunk_slice(i, size: int):
  """Rows of chunk i (a traced index) of `size` rows."""
  return pl.ds(pl.multiple_of(i * size, size), size)


class Masks(NamedTuple):
  """The document masks of one chunk (module docstring): `incl`, `strict` `[C, C]` bool
  (s <= t, s < t, one document); `first`, `last` `[C, 1]` and `keep` `[1, 1]`, float32
  0 or 1."""

  incl: Any
  strict: Any
  first: Any
  last: Any
  keep: Any


def masks(d) -> Masks:
  """The masks of a chunk from its documents d `[C, 1]` (float32, `chunk_documents`)."""
  c = d.shape[0]
  same = (d - d.T) == 0.0
  d_end = last(d)
  one = lambda cond: jnp.where(cond, 1.0, 0.0).astype(F32)
  return Masks(
    lower(c) & same, lower(c, strict=True) & same, one(d == 0.0), one(d == d_end), one(d_end == 0.0)
  )


class Factors(NamedTuple):
  """The decay factors of a chunk from its cumulative log-decays b `[C, dg]` (all None
  without a decay): e^b `[C, dg]`, e^{b_C} `[1, dg]`, e^{b_C - b} `[C, dg]`."""

  eb: Optional[Any]
  el: Optional[Any]
  ekd: Optional[Any]


def factors(b) -> Factors:
  if b is None:
    return Factors(None, None, None)
  bl = last(b)
  return Factors(jnp.exp(b), jnp.exp(bl), jnp.exp(bl - b))


def state_decay_grad(s, ds, dg: int):
  """sum_v S * dS per state row `[1, DK]` (dg > 1), or over the whole state `[1, 1]`."""
  rows = jnp.sum(s * ds, axis=1, keepdims=True)  # [DK, 1]
  return jnp.sum(rows, axis=0, keepdims=True) if dg == 1 else rows.T


def compute_dtype(q, k, v, name: str):
  """The dtype of q, k, v (their common one: float32 or bfloat16), else a one-line error."""
  dtype = jnp.dtype(jnp.result_type(q.dtype, k.dtype, v.dtype))
  if dtype not in DTYPES:
    raise ValueError(f'{name}: q, k, v of dtype {dtype}; the kernels take float32 or bfloat16')
  return dtype


# ----------------------------------------------------------------------------
# Under a mesh: one kernel call per device.
# ----------------------------------------------------------------------------

ARRAYS = ('q', 'k', 'v', 'log_decay', 'beta', 'initial_state', 'segment_ids')


def batch_axes(batch: int):
  """The ambient mesh's axes a kernel call's batch is split over: its automatic or explicit
  axes of more than one device, the longest prefix whose size divides `batch`; None off a
  mesh or inside a `shard_map` over every axis."""
  mesh = jax.sharding.get_abstract_mesh()
  names = tuple(
    a
    for a, t in zip(mesh.axis_names, mesh.axis_types)
    if t != jax.sharding.AxisType.Manual and mesh.shape[a] > 1
  )
  while names and batch % math.prod(mesh.shape[a] for a in names):
    names = names[:-1]
  return names or None


def per_device(recurrence):
  """`recurrence(q, k, v, log_decay, beta, *, initial_state, segment_ids, **static)` (a
  kernel entry point, its arrays batch first) run in `jax.shard_map` under a mesh, each
  device on its part of the batch (`batch_axes`): XLA does not partition a custom call, and
  would otherwise gather the whole batch to every device and run all of it there. The
  batch's examples are independent, so the result is the same. On a mesh of explicit axes
  every explicit axis is made manual (Pallas's interpreter refuses explicitly sharded
  values), the inputs are resharded to the split, and the outputs back to q's sharding."""

  @functools.wraps(recurrence)
  def run(
    q,
    k,
    v,
    log_decay=None,
    beta=None,
    *,
    initial_state=None,
    segment_ids=None,
    state=None,
    **static,
  ):
    # `state`: the XLA chunk forms' former name of `initial_state`, which
    # `ops.delta.sharded` still passes to whichever core it runs; to go once they take
    # `initial_state` (docs/design.md, "One interface for the recurrences").
    if state is not None:
      if initial_state is not None:
        raise ValueError(f'{recurrence.__name__}: state and initial_state given; valid: one')
      initial_state = state
    mesh = jax.sharding.get_abstract_mesh()
    axes = batch_axes(q.shape[0])
    explicit = {
      a for a, t in zip(mesh.axis_names, mesh.axis_types) if t == jax.sharding.AxisType.Explicit
    }
    arrays = (q, k, v, log_decay, beta, initial_state, segment_ids)
    call = lambda q, k, v, log_decay, beta, initial_state, segment_ids: recurrence(
      q, k, v, log_decay, beta, initial_state=initial_state, segment_ids=segment_ids, **static
    )
    if axes is None and not explicit:
      return call(*arrays)
    given = {n: x for n, x in zip(ARRAYS, arrays) if x is not None}
    split = P(axes)
    if explicit:
      before = tuple(jax.typeof(q).sharding.spec) + (None,) * 3
      given = {n: jax.sharding.reshard(x, split) for n, x in given.items()}

    out, st = jax.shard_map(
      lambda given: call(*(given.get(n) for n in ARRAYS)),
      in_specs=({n: split for n in given},),
      out_specs=(split, split),
      axis_names=set(axes or ()) | explicit,
      check_vma=False,
    )(given)
    if explicit:
      out = jax.sharding.reshard(out, P(*before[:3]))
      st = jax.sharding.reshard(st, P(before[0], before[2]))
    return out, st

  return run

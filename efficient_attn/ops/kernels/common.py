"""What the recurrence kernels share: the block layout, the per-platform `pallas_call`, and
small in-kernel helpers written for Triton's rules (2-D values, dots of power-of-two tiles
>= 16, no slicing of values: a row or column is taken by a masked sum).

Layout. A kernel sees one (batch, head) per program: q, k `[N, DK]`, v `[N, DV]`,
cumulative log-decays `[N, 1 or DK]`, beta `[N, 1]`, with N = n_chunks * C. The chunk
form's chunk c (as `gated.common.to_chunks`: c = min(chunk_size, n)) is kept exactly:
each chunk of c tokens is zero-padded to C = max(16, next power of two >= c) tokens,
and the feature dims to DK, DV = max(16, next power of two). A padded token has
k = v = 0, log-decay 0 and beta 0, so it neither writes nor decays, and the result
equals the chunk form at chunk c; the padding only makes every block a legal Triton
tile (Triton's dots take power-of-two tiles of at least 16). The log-decays are
summed within each chunk here, in XLA (`chunk_cumsum`), and their gradient summed back
(autodiff of the cumulative sum), so the kernels read chunk-local cumulative
log-decays b_t <= 0, and every decay factor they form is exp of a masked difference <= 0.

Platforms: on CPU the kernels run in Pallas's interpret mode (how the tests run them);
on GPU they are lowered by Triton, on TPU by Mosaic. Neither lowering has been run
on hardware yet (no accelerator was available when they were written): the kernels
keep to what the two lowerings document (see each kernel's notes).
"""

import functools
import math
from typing import NamedTuple, Optional

import jax
from jax import lax
from jax.experimental import pallas as pl
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

F32 = jnp.float32
MIN_TILE = 16  # Triton's smallest dot tile
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def tile(d: int) -> int:
  """The smallest power of two >= max(d, MIN_TILE)."""
  return max(MIN_TILE, pl.next_power_of_2(int(d)))


class Layout(NamedTuple):
  """The static shape of one call: b, h, n (tokens), c (the chunk form's chunk), C (the
  kernel's padded chunk), nc (chunks), dk, dv and their tiles DK, DV, dg (1: a decay per
  head; dk: per key feature; 0: none)."""

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


def layout(q, v, g, chunk_size: int) -> Layout:
  b, n, h, dk = q.shape
  dv = v.shape[-1]
  c = max(1, min(int(chunk_size), n))
  dg = 0 if g is None else g.shape[-1]
  return Layout(
    b, h, n, c, tile(c), -(-n // c), dk, dv, tile(dk), tile(dv), dg if dg <= 1 else tile(dk)
  )


def to_blocks(x, lay: Layout, d_tile: int, dtype=None):
  """`[b, n, h, d]` (or `[b, n, h]`, as `[..., 1]`) -> `[b * h, N, d_tile]`, each chunk of c
  tokens zero-padded to C and the features to d_tile."""
  if x.ndim == 3:
    x = x[..., None]
  x = jnp.swapaxes(x if dtype is None else x.astype(dtype), 1, 2)  # [b, h, n, d]
  x = jnp.pad(x, [(0, 0), (0, 0), (0, lay.nc * lay.c - lay.n), (0, 0)])
  x = x.reshape(lay.b, lay.h, lay.nc, lay.c, x.shape[-1])
  x = jnp.pad(x, [(0, 0)] * 3 + [(0, lay.C - lay.c), (0, d_tile - x.shape[-1])])
  return x.reshape(lay.b * lay.h, lay.N, d_tile)


def from_blocks(y, lay: Layout, d: int):
  """`[b * h, N, D]` -> `[b, n, h, d]`: the inverse of `to_blocks`."""
  y = y.reshape(lay.b, lay.h, lay.nc, lay.C, y.shape[-1])[:, :, :, : lay.c, :d]
  y = y.reshape(lay.b, lay.h, lay.nc * lay.c, d)[:, :, : lay.n]
  return jnp.swapaxes(y, 1, 2)


def chunk_cumsum(g, lay: Layout):
  """Log-decays `[b, n, h, dg]` -> chunk-local inclusive cumulative sums `[b * h, N, dg']`
  (float32; dg' = 1 or DK)."""
  x = to_blocks(g, lay, lay.dg, F32).reshape(lay.b * lay.h, lay.nc, lay.C, lay.dg)
  return jnp.cumsum(x, axis=2).reshape(lay.b * lay.h, lay.N, lay.dg)


def state_blocks(state, lay: Layout):
  """The initial state `[b, h, dk, dv]` (None: zeros) -> `[b * h, DK, DV]` float32."""
  if state is None:
    return jnp.zeros((lay.b * lay.h, lay.DK, lay.DV), F32)
  s = jnp.pad(state.astype(F32), [(0, 0), (0, 0), (0, lay.DK - lay.dk), (0, lay.DV - lay.dv)])
  return s.reshape(lay.b * lay.h, lay.DK, lay.DV)


def state_from_blocks(s, lay: Layout):
  return s.reshape(lay.b, lay.h, lay.DK, lay.DV)[:, :, : lay.dk, : lay.dv]


def compute_dtype(q, k, v, name: str):
  """The dtype of q, k, v (their common one: float32 or bfloat16), else a one-line error."""
  dtype = jnp.dtype(jnp.result_type(q.dtype, k.dtype, v.dtype))
  if dtype not in DTYPES:
    raise ValueError(f'{name}: q, k, v of dtype {dtype}; the kernels take float32 or bfloat16')
  return dtype


# ----------------------------------------------------------------------------
# pallas_call per platform.
# ----------------------------------------------------------------------------


def platform() -> str:
  """The default backend: 'cpu', 'gpu' or 'tpu'."""
  return jax.default_backend()


def _compiler_params(on: str):
  if on == 'gpu':
    from jax.experimental.pallas import triton as plgpu  # pylint: disable=g-import-not-at-top

    # Not tuned on hardware: 4 warps suit 64 x 64 tiles (fla's chunk kernels use 4).
    return plgpu.CompilerParams(num_warps=4, num_stages=1)
  if on == 'tpu':
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top

    return pltpu.CompilerParams(dimension_semantics=('parallel',))
  return None


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
  """`recurrence(q, k, v, g, beta, state, chunk_size, on=...)` (a kernel entry point, its
  arrays batch first) run in `jax.shard_map` under a mesh, each device on its part of the
  batch (`batch_axes`): XLA does not partition a custom call, and would otherwise gather the
  whole batch to every device and run all of it there. The batch's examples are
  independent, so the result is the same. On a mesh of explicit axes every explicit axis is
  made manual (Pallas's interpreter refuses explicitly sharded values), the inputs are
  resharded to the split, and the outputs back to q's sharding."""

  @functools.wraps(recurrence)
  def run(q, k, v, g, beta=None, state=None, chunk_size: int = 64, *, on=None):
    mesh = jax.sharding.get_abstract_mesh()
    axes = batch_axes(q.shape[0])
    explicit = {
      a for a, t in zip(mesh.axis_names, mesh.axis_types) if t == jax.sharding.AxisType.Explicit
    }
    if axes is None and not explicit:
      return recurrence(q, k, v, g, beta, state, chunk_size, on=on)
    given = {i: x for i, x in enumerate((q, k, v, g, beta, state)) if x is not None}
    split = P(axes)
    if explicit:
      before = tuple(jax.typeof(q).sharding.spec) + (None,) * 3
      given = {i: jax.sharding.reshard(x, split) for i, x in given.items()}

    def body(given):
      arrays = [given.get(i) for i in range(6)]
      return recurrence(*arrays, chunk_size, on=on)

    out, st = jax.shard_map(
      body,
      in_specs=({i: split for i in given},),
      out_specs=(split, split),
      axis_names=set(axes or ()) | explicit,
      check_vma=False,
    )(given)
    if explicit:
      out = jax.sharding.reshard(out, P(*before[:3]))
      st = jax.sharding.reshard(st, P(before[0], before[2]))
    return out, st

  return run


def call(kernel, *, rows: int, ins, outs, name: str, on: Optional[str] = None):
  """`pl.pallas_call` over a grid of `rows` programs (one per (batch, head)).

  ins: the input arrays `[rows, ...]`; outs: ShapeDtypeStructs `[rows, ...]`. Each program
  sees its own row of each (the row axis squeezed). On CPU the call is interpreted.
  """
  on = on or platform()

  def spec(shape):
    rest = (0,) * (len(shape) - 1)
    return pl.BlockSpec((None,) + tuple(shape[1:]), lambda i: (i,) + rest)

  return pl.pallas_call(
    kernel,
    grid=(rows,),
    name=name,
    in_specs=[spec(x.shape) for x in ins],
    out_specs=[spec(out.shape) for out in outs],
    out_shape=list(outs),
    compiler_params=_compiler_params(on),
    interpret=on == 'cpu',
  )(*ins)


# ----------------------------------------------------------------------------
# In-kernel helpers (values, not refs).
# ----------------------------------------------------------------------------


def dot(a, b, dtype, ta: bool = False, tb: bool = False):
  """a @ b (a^T with ta, b^T with tb) with operands in `dtype` and float32 accumulation."""
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  return lax.dot_general(a.astype(dtype), b.astype(dtype), dims, preferred_element_type=F32)


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


def lower(c: int, strict: bool = False):
  """The causal mask `[c, c]`: s <= t (s < t with strict)."""
  t, s = iota((c, c), 0), iota((c, c), 1)
  return s < t if strict else s <= t


def decay_matrix(b, mask):
  """exp(b_t - b_s) where mask[t, s], else 0: `[C, C]` from cumulative log-decays b `[C, 1]`
  (masked before exp, so every factor is <= 1)."""
  diff = b - b.T
  return jnp.where(mask, jnp.exp(jnp.where(mask, diff, 0.0)), 0.0)


def feature_sum(x, dg: int):
  """x `[r, d]` summed over features to `[r, 1]` for a per-head decay (dg = 1), else x."""
  return jnp.sum(x, axis=1, keepdims=True) if dg == 1 else x


def chunk_slice(i, size: int):
  """Rows of chunk i (a traced index) of `size` rows."""
  return pl.ds(pl.multiple_of(i * size, size), size)


def eye(c: int):
  """The identity `[c, c]` (float32), built from iotas inside the kernel."""
  return jnp.where(iota((c, c), 0) == iota((c, c), 1), 1.0, 0.0).astype(F32)

"""The GPU (Triton) driver of the recurrence kernels, and the tiles it takes per GPU.

A Triton program cannot wait for another, so the chunks of a row cannot be grid steps that
pass the state on (as on TPU, `tpu.py`): one program per (batch * heads, value tile)
walks its row's chunks in a `fori_loop`, its refs in HBM, one chunk's tiles loaded at a
time, the state `[DK, BV]` float32 carried in registers.

  forward:   (o, S') = step(chunk, S) for each chunk in order; with `save`, S is written as
             the chunk's start state (`[rows, chunks * DK, DV]`, the backward's residual).
  backward:  the chunks in reverse, carrying dS; dv is the tile's own, while the gradients
             of q, k, b and beta sum over the value tiles (each tile writes its share to
             `[rows, tiles, N, w]`, summed after the call, as fla's kernels do).

Tiles. The state's columns are independent (each column of S follows the recurrence on its
own), so a value tile BV < DV splits the state and v without changing the math, and bounds
the shared memory a program needs. `gpu_blocks` picks the widest value tile whose
estimated shared memory (`shared_memory_bytes`) fits the GPU's limit with a margin.
"""

import functools
from typing import Optional

import jax
from jax import lax
from jax.experimental import pallas as pl
import jax.numpy as jnp

from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels.common import F32

# Shared memory per block that a kernel may use (the opt-in maximum), bytes, by compute
# capability (NVIDIA's CUDA C Programming Guide, "Technical Specifications per Compute
# Capability"). A capability not listed takes the smallest of these.
SHARED_MEMORY = {
  (7, 0): 96 * 1024,
  (7, 5): 64 * 1024,
  (8, 0): 163 * 1024,
  (8, 6): 99 * 1024,
  (8, 7): 163 * 1024,
  (8, 9): 99 * 1024,
  (9, 0): 227 * 1024,
  (10, 0): 227 * 1024,
  (12, 0): 99 * 1024,
}
MARGIN = 0.8  # the share of the limit an estimate may use (see `shared_memory_bytes`)
NUM_WARPS = 4  # fla's chunk kernels use 4 warps for 64 x 64 tiles; not tuned on hardware
NUM_STAGES = 1  # no software pipelining of the chunk loop: it would multiply the buffers


def _sds(shape):
  return jax.ShapeDtypeStruct(shape, F32)


def limit(capability) -> int:
  """The shared memory per block of a compute capability ('8.6', (8, 6) or None: the
  smallest of `SHARED_MEMORY`), bytes."""
  if capability is None:
    return min(SHARED_MEMORY.values())
  if isinstance(capability, str):
    capability = tuple(int(x) for x in capability.split('.')[:2])
  return SHARED_MEMORY.get(tuple(capability), min(SHARED_MEMORY.values()))


def shared_memory_bytes(delta: bool, chunk: int, dk: int, bv: int, dtype, decay: str) -> int:
  """An estimate of the shared memory (bytes) of the larger of a kernel's forward and
  backward programs, from its tiles.

  delta: the delta rule (else the decay family); chunk, dk, bv: the tiles C, DK, BV; dtype:
  the dots' operand dtype; decay: 'none', 'head' or 'feature'.

  Triton stages each dot's operands through shared memory (on sm_80 to change their layout
  for the tensor cores; on sm_90 wgmma reads them there), and a layout change or a
  reduction across warps goes through it too; the allocator reuses a buffer once its
  value is dead. The estimate counts the operand tiles that are live together in the
  kernel's largest step (the backward's): see the terms below.
  """
  e = jnp.dtype(dtype).itemsize
  c, k, v = chunk, dk, bv
  if delta:
    # the state S and dS as dot operands (both layouts), the chunk's q, k, W and their
    # gradients [C, DK], the value-sized U, dU, dO [C, BV], and T, P, A [C, C].
    terms = 4 * k * v * e + 4 * c * k * e + 3 * c * v * e + 3 * c * c * e
  else:
    terms = 3 * k * v * e + 2 * c * k * e + 2 * c * v * e + c * c * e
  if decay == 'feature':
    terms += c * k * 4  # the per-feature factors [C, DK] float32 of the key loop
  return int(terms)


def capability():
  """The compute capability of the first local GPU ('9.0'), or None where there is none
  (a CPU host lowering for a GPU: `gpu_blocks` then takes tiles that fit every GPU)."""
  try:
    return jax.devices('gpu')[0].compute_capability
  except RuntimeError:
    return None


def gpu_blocks(
  capability, dk: int, dv: int, dtype, *, delta: bool = True, chunk: int = 64, decay: str = 'head'
) -> int:
  """The value tile BV (a power of two, 16 <= BV <= DV) for a GPU of `capability` (see
  `limit`): the widest whose `shared_memory_bytes` is within MARGIN of the limit, else 16
  (the narrowest; Triton then refuses at compile time if it does not fit either).
  dk, dv, chunk: the head dims and the chunk (padded to tiles here)."""
  budget = MARGIN * limit(capability)
  DK, DV, C = common.tile(dk), common.tile(dv), common.tile(chunk)  # pylint: disable=invalid-name
  bv = DV
  while bv > common.MIN_TILE and shared_memory_bytes(delta, C, DK, bv, dtype, decay) > budget:
    bv //= 2
  return bv


def _params(interpret: bool):
  if interpret:
    return None
  from jax.experimental.pallas import triton as pltriton  # pylint: disable=g-import-not-at-top

  return pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES)


def _row_specs(xs, cfg):
  """Each input's whole row `[N, w]` (v: the program's value tile `[N, BV]`)."""
  lay = cfg.lay
  specs = []
  for name, x in xs.items():
    if name == 'd':
      specs.append(pl.BlockSpec((None, lay.N, 1), lambda i, t: (lax.div(i, lay.h), 0, 0)))
    elif name == 'v':
      specs.append(pl.BlockSpec((None, lay.N, cfg.bv), lambda i, t: (i, 0, t)))
    else:
      specs.append(pl.BlockSpec((None, lay.N, x.shape[-1]), lambda i, t: (i, 0, 0)))
  return specs


def _tiles(cfg) -> int:
  return cfg.lay.DV // cfg.bv


def forward(kind, cfg, xs, s0, *, save: bool, interpret: bool):
  """As `tpu.forward`: (out, final state, start states `[rows, nc, DK, DV]` or None)."""
  lay, bv = cfg.lay, cfg.bv
  names = list(xs)
  state = pl.BlockSpec((None, lay.DK, bv), lambda i, t: (i, 0, t))

  def kernel(*refs):
    n = len(names)
    x_refs, (s0_ref, o_ref, st_ref) = refs[:n], refs[n : n + 3]
    h_ref = refs[n + 3] if save else None

    def body(j, s):
      rows = common.chunk_slice(j, lay.C)
      if save:
        h_ref[common.chunk_slice(j, lay.DK), :] = s
      o, s_next = kind.forward(cfg, {name: r[rows, :] for name, r in zip(names, x_refs)}, s)
      o_ref[rows, :] = o
      return s_next

    st_ref[...] = lax.fori_loop(0, lay.nc, body, s0_ref[...])

  out_specs = [pl.BlockSpec((None, lay.N, bv), lambda i, t: (i, 0, t)), state]
  out_shape = [_sds((lay.rows, lay.N, lay.DV)), _sds((lay.rows, lay.DK, lay.DV))]
  if save:
    out_specs.append(pl.BlockSpec((None, lay.nc * lay.DK, bv), lambda i, t: (i, 0, t)))
    out_shape.append(_sds((lay.rows, lay.nc * lay.DK, lay.DV)))
  outs = pl.pallas_call(
    kernel,
    grid=(lay.rows, _tiles(cfg)),
    in_specs=_row_specs(xs, cfg) + [state],
    out_specs=out_specs,
    out_shape=out_shape,
    compiler_params=_params(interpret),
    interpret=interpret,
    name=f'{cfg.name}_forward',
  )(*xs.values(), s0)
  h = outs[2].reshape(lay.rows, lay.nc, lay.DK, lay.DV) if save else None
  return outs[0], outs[1], h


def backward(kind, cfg, xs, h, do, dst, *, interpret: bool):
  """As `tpu.backward`: ({name: gradient `[rows, N, w]`}, dS0 `[rows, DK, DV]`)."""
  lay, bv = cfg.lay, cfg.bv
  tiles = _tiles(cfg)
  names = list(xs)
  grads = [n for n in names if n != 'd']
  state = pl.BlockSpec((None, lay.DK, bv), lambda i, t: (i, 0, t))
  values = pl.BlockSpec((None, lay.N, bv), lambda i, t: (i, 0, t))
  in_specs = _row_specs(xs, cfg) + [
    pl.BlockSpec((None, lay.nc * lay.DK, bv), lambda i, t: (i, 0, t)),
    values,
    state,
  ]

  def kernel(*refs):
    n = len(names)
    x_refs, (h_ref, do_ref, dst_ref) = refs[:n], refs[n : n + 3]
    g_refs, ds0_ref = refs[n + 3 : n + 3 + len(grads)], refs[-1]

    def body(jj, ds):
      j = lay.nc - 1 - jj
      rows = common.chunk_slice(j, lay.C)
      x = {name: r[rows, :] for name, r in zip(names, x_refs)}
      s = h_ref[common.chunk_slice(j, lay.DK), :]
      g, ds_prev = kind.backward(cfg, x, s, ds, do_ref[rows, :])
      for name, r in zip(grads, g_refs):
        r[rows, :] = g[name]
      return ds_prev

    ds0_ref[...] = lax.fori_loop(0, lay.nc, body, dst_ref[...])

  out_specs, out_shape = [], []
  for name in grads:
    w = xs[name].shape[-1]
    if name == 'v':
      out_specs.append(values)
      out_shape.append(_sds((lay.rows, lay.N, lay.DV)))
    else:  # each value tile's share, summed below
      out_specs.append(pl.BlockSpec((None, None, lay.N, w), lambda i, t: (i, t, 0, 0)))
      out_shape.append(_sds((lay.rows, tiles, lay.N, w)))
  outs = pl.pallas_call(
    kernel,
    grid=(lay.rows, tiles),
    in_specs=in_specs,
    out_specs=out_specs + [state],
    out_shape=out_shape + [_sds((lay.rows, lay.DK, lay.DV))],
    compiler_params=_params(interpret),
    interpret=interpret,
    name=f'{cfg.name}_backward',
  )(*xs.values(), h.reshape(lay.rows, lay.nc * lay.DK, lay.DV), do, dst)
  summed = {n: g if n == 'v' else jnp.sum(g, axis=1) for n, g in zip(grads, outs[:-1])}
  return summed, outs[-1]


@functools.lru_cache(maxsize=None)
def _cached_capability():
  return capability()


def value_tile(cfg, requested: Optional[int] = None) -> int:
  """The value tile of a call: `requested` (tests, tuning), else `gpu_blocks` for the local
  GPU (None on a CPU host: the tiles that fit every GPU)."""
  if requested is not None:
    return requested
  lay = cfg.lay
  return gpu_blocks(
    _cached_capability(), lay.dk, lay.dv, cfg.dtype, delta=cfg.delta, chunk=lay.C, decay=cfg.decay
  )

"""The TPU (Mosaic) driver of the recurrence kernels, and its interpretation on CPU: a grid
over the sequence, so that the memory a program holds does not grow with the length.

The grid is `(batch * heads, chunks)` with dimension semantics `('parallel', 'arbitrary')`:
the rows are independent, and the chunks of a row run in order on one core. Each step
holds one chunk's blocks (q, k `[C, DK]`, v `[C, DV]`, b, beta, d `[C, 1 or DK]`) and the
state in a VMEM scratch `[DK, DV]` float32, set from the initial state at chunk 0.

  forward:   S <- S0 at chunk 0; (o, S') = step(chunk, S); with `save`, S is written as
             the chunk's start state (`[rows, chunks, DK, DV]` in HBM, the backward's
             residual); the final state is written at the last chunk.
  backward:  the same grid, the chunks walked in reverse through the index maps
             (chunk nc - 1 - j at step j); dS <- dS_final at step 0, then
             (grads, dS) = step_backward(chunk, S_chunk, dS, dO); dS0 at the end.

The VMEM a step uses is a constant number of chunk- and state-sized blocks (double
buffered by Pallas), whatever the length. The chunk's math is the kind's
(`scalar_decay`, `delta`); float32 dots are computed in float32 (`Precision.HIGHEST`).
"""

import jax
from jax import lax
from jax.experimental import pallas as pl

from efficient_attn.ops.kernels.common import F32


def _sds(shape):
  return jax.ShapeDtypeStruct(shape, F32)


def _params(interpret: bool):
  if interpret:
    return None
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top

  return pltpu.CompilerParams(dimension_semantics=('parallel', 'arbitrary'))


def _scratch(lay):
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top

  return [pltpu.VMEM((lay.DK, lay.DV), F32)]


def _call(kernel, cfg, in_specs, out_specs, out_shape, interpret: bool, what: str):
  """The `pallas_call` of a kernel over the grid (rows, chunks), the state in scratch."""
  lay = cfg.lay
  return pl.pallas_call(
    kernel,
    grid=(lay.rows, lay.nc),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    scratch_shapes=_scratch(lay),
    compiler_params=_params(interpret),
    interpret=interpret,
    name=f'{cfg.name}_{what}',
  )


def _chunk_specs(xs, lay, reverse: bool):
  """One chunk's block of each input `[rows, N, w]` (d: `[b, N, 1]`, shared by the heads)."""
  chunk = (lambda j: lay.nc - 1 - j) if reverse else (lambda j: j)
  specs = []
  for name, x in xs.items():
    if name == 'd':
      index = lambda i, j: (lax.div(i, lay.h), chunk(j), 0)
    else:
      index = lambda i, j: (i, chunk(j), 0)
    specs.append(pl.BlockSpec((None, lay.C, x.shape[-1]), index))
  return specs


def forward(kind, cfg, xs, s0, *, save: bool, interpret: bool):
  """(out `[rows, N, DV]`, final state `[rows, DK, DV]`, start states `[rows, nc, DK, DV]`
  or None) of `kind` on the blocks `xs` ({name: `[rows, N, w]`}) from s0 `[rows, DK, DV]`."""
  lay = cfg.lay
  names = list(xs)
  state = pl.BlockSpec((None, lay.DK, lay.DV), lambda i, j: (i, 0, 0))

  def kernel(*refs):
    n = len(names)
    x_refs, (s0_ref, o_ref, st_ref), rest = refs[:n], refs[n : n + 3], refs[n + 3 :]
    h_ref, s_scr = (rest[0], rest[1]) if save else (None, rest[0])
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
      s_scr[...] = s0_ref[...]

    s = s_scr[...]
    if save:
      h_ref[...] = s
    o, s_next = kind.forward(cfg, {n: r[...] for n, r in zip(names, x_refs)}, s)
    o_ref[...] = o
    s_scr[...] = s_next

    @pl.when(j == lay.nc - 1)
    def _():
      st_ref[...] = s_next

  out_specs = [pl.BlockSpec((None, lay.C, lay.DV), lambda i, j: (i, j, 0)), state]
  out_shape = [_sds((lay.rows, lay.N, lay.DV)), _sds((lay.rows, lay.DK, lay.DV))]
  if save:
    out_specs.append(pl.BlockSpec((None, None, lay.DK, lay.DV), lambda i, j: (i, j, 0, 0)))
    out_shape.append(_sds((lay.rows, lay.nc, lay.DK, lay.DV)))
  in_specs = _chunk_specs(xs, lay, reverse=False) + [state]
  call = _call(kernel, cfg, in_specs, out_specs, out_shape, interpret, 'forward')
  outs = call(*xs.values(), s0)
  return outs[0], outs[1], (outs[2] if save else None)


def backward(kind, cfg, xs, h, do, dst, *, interpret: bool):
  """({name: gradient `[rows, N, w]` float32} of every input but d, dS0 `[rows, DK, DV]`)
  from the start states h `[rows, nc, DK, DV]`, dO `[rows, N, DV]` and dS_final."""
  lay = cfg.lay
  names = list(xs)
  grads = [n for n in names if n != 'd']
  back = lambda i, j: (i, lay.nc - 1 - j, 0)
  state = pl.BlockSpec((None, lay.DK, lay.DV), lambda i, j: (i, 0, 0))
  in_specs = _chunk_specs(xs, lay, reverse=True) + [
    pl.BlockSpec((None, None, lay.DK, lay.DV), lambda i, j: (i, lay.nc - 1 - j, 0, 0)),
    pl.BlockSpec((None, lay.C, lay.DV), back),
    state,
  ]

  def kernel(*refs):
    n = len(names)
    x_refs, (h_ref, do_ref, dst_ref) = refs[:n], refs[n : n + 3]
    g_refs, (ds0_ref, ds_scr) = refs[n + 3 : n + 3 + len(grads)], refs[n + 3 + len(grads) :]
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
      ds_scr[...] = dst_ref[...]

    x = {name: r[...] for name, r in zip(names, x_refs)}
    g, ds_prev = kind.backward(cfg, x, h_ref[...], ds_scr[...], do_ref[...])
    for name, r in zip(grads, g_refs):
      r[...] = g[name]
    ds_scr[...] = ds_prev

    @pl.when(j == lay.nc - 1)
    def _():
      ds0_ref[...] = ds_prev

  out_specs = [pl.BlockSpec((None, lay.C, xs[n].shape[-1]), back) for n in grads] + [state]
  out_shape = [_sds(xs[n].shape) for n in grads] + [_sds((lay.rows, lay.DK, lay.DV))]
  call = _call(kernel, cfg, in_specs, out_specs, out_shape, interpret, 'backward')
  outs = call(*xs.values(), h, do, dst)
  return dict(zip(grads, outs[:-1])), outs[-1]

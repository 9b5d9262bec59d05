"""One call of a recurrence kernel: the checks, the inputs as blocks, the `jax.custom_vjp`
of the forward and backward kernels, and the platform chosen when lowering.

The platform is not read from `jax.default_backend()` at trace time: each kernel call is
`jax.lax.platform_dependent(cpu=interpreted, cuda=triton, tpu=mosaic)`, so a CPU host that
exports or compiles ahead of time for a GPU or a TPU gets the real kernel there (and the
interpreter runs only on a CPU). `backend` narrows it to one driver ('mosaic': the grid
over chunks of `tpu.py`; 'triton': the loop over chunks of `gpu.py`), interpreted on a
CPU, compiled on its own platform: the tests run each driver's code this way.

The residuals of the backward are the blocked inputs and each chunk's start state
(`[rows, chunks, DK, DV]` float32), the same on every platform.
"""

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp

from efficient_attn.ops import segments
from efficient_attn.ops.kernels import common
from efficient_attn.ops.kernels import gpu
from efficient_attn.ops.kernels import tpu
from efficient_attn.ops.kernels.common import F32

BACKENDS = ('mosaic', 'triton')
# float32 dots on a GPU: 'tf32' (Triton's default, fla's) or 'highest' (IEEE float32).
# The tolerance each gives, the largest error of outputs and gradients over
# max(1, max |reference|) against the float64 token recurrence (1 x 512 tokens x 2 heads
# of 64, chunks of 64, decays in [0.9, 1], the GPU driver interpreted on a CPU):
#   'highest'  <= 7e-7 (float32 round-off; the tests hold it to 2e-5 at their shapes);
#   'tf32'     <= 2.4e-3 (scalar decay 1.7e-3, vector decay 1.2e-3, delta rule 2.4e-3),
#              measured with each float32 operand's mantissa truncated to TF32's 10 bits
#              and float32 accumulation (an emulation: not yet measured on a GPU).
# A TPU and the interpreter compute float32 dots in float32 (Precision.HIGHEST) whatever
# is asked; bfloat16 operands are unaffected.
GPU_PRECISION = {'tf32': lax.Precision.DEFAULT, 'highest': lax.Precision.HIGHEST}


class Kind(NamedTuple):
  """A kind of recurrence: the math of one chunk, forward and backward (values, in kernel).

  forward(cfg, x, s) -> (o `[C, BV]`, s' `[DK, BV]`); backward(cfg, x, s, ds, do) ->
  ({name: gradient `[C, w]`}, ds_prev `[DK, BV]`); x: {name: the chunk's block} of q, k,
  v (its value tile), b (cumulative log-decays, with a decay), beta (delta rule) and d (the
  documents, `common.chunk_documents`)."""

  forward: Callable[..., Any]
  backward: Callable[..., Any]


class Static(NamedTuple):
  kind: Kind
  cfg: common.Config
  backend: Optional[str]
  precision: str
  value_tile: Optional[int]


def _driver_cfg(static: Static, driver: str, interpret: bool) -> common.Config:
  cfg = static.cfg
  if driver == 'triton':
    precision = lax.Precision.HIGHEST if interpret else GPU_PRECISION[static.precision]
    return cfg._replace(precision=precision, bv=gpu.value_tile(cfg, static.value_tile))
  return cfg._replace(precision=lax.Precision.HIGHEST, bv=cfg.lay.DV)


def _per_platform(static: Static, run: Callable[..., Any], *args):
  """`run(driver_module, cfg, *args, interpret=...)` on the platform the call is lowered for."""
  drivers = {'mosaic': tpu, 'triton': gpu}
  branch = lambda driver, interpret: (
    lambda *a: run(drivers[driver], _driver_cfg(static, driver, interpret), *a, interpret=interpret)
  )
  per_platform = {'cpu': branch(static.backend or 'mosaic', True)}
  if static.backend in (None, 'triton'):
    per_platform['cuda'] = branch('triton', False)
  if static.backend in (None, 'mosaic'):
    per_platform['tpu'] = branch('mosaic', False)
  return lax.platform_dependent(*args, **per_platform)


def _forward(static: Static, xs, s0, save: bool):
  run = lambda driver, cfg, xs, s0, interpret: driver.forward(
    static.kind, cfg, xs, s0, save=save, interpret=interpret
  )
  return _per_platform(static, run, xs, s0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(static: Static, xs, s0):
  out, st, _ = _forward(static, xs, s0, save=False)
  return out, st


def _core_fwd(static: Static, xs, s0):
  out, st, h = _forward(static, xs, s0, save=True)
  return (out, st), (xs, h)


def _core_bwd(static: Static, residuals, cotangents):
  xs, h = residuals
  do, dst = (x.astype(F32) for x in cotangents)
  run = lambda driver, cfg, xs, h, do, dst, interpret: driver.backward(
    static.kind, cfg, xs, h, do, dst, interpret=interpret
  )
  grads, ds0 = _per_platform(static, run, xs, h, do, dst)
  dxs = {n: grads[n].astype(x.dtype) if n in grads else jnp.zeros_like(x) for n, x in xs.items()}
  return dxs, ds0


_core.defvjp(_core_fwd, _core_bwd)


def _check_shape(name: str, what: str, x, shapes):
  if x is not None and tuple(x.shape) not in [tuple(s) for s in shapes]:
    valid = ' or '.join(str(list(s)) for s in shapes)
    raise ValueError(f'{name}: {what} of shape {list(x.shape)}; valid: {valid}')


def run(
  kind: Kind,
  name: str,
  q,
  k,
  v,
  log_decay,
  beta,
  *,
  decays,
  initial_state,
  segment_ids,
  chunk_size: int,
  precision: str,
  backend: Optional[str],
  value_tile: Optional[int],
):
  """The recurrence `kind` by its kernels (the arguments as `scalar_decay_chunked`'s).

  decays: the log-decay widths the kind takes (of 0: none, 1: per head, 'dk': per key
  feature). Returns (out `[b, n, h, dv]`, final state `[b, h, dk, dv]`), float32.
  """
  dtype = common.compute_dtype(q, k, v, name)
  b, n, h, dk = q.shape
  dv = v.shape[-1]
  if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
    raise ValueError(
      f'{name}: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}; valid: q and k '
      f'[batch, length, heads, dk], v [batch, length, heads, dv]'
    )
  widths = [dk if w == 'dk' else w for w in decays]
  got = 0 if log_decay is None else log_decay.shape[-1]
  if got not in widths or (log_decay is not None and log_decay.shape[:3] != q.shape[:3]):
    valid = ', '.join('None' if w == 0 else str([b, n, h, w]) for w in widths)
    shape = None if log_decay is None else list(log_decay.shape)
    raise ValueError(f'{name}: log_decay of shape {shape}; valid: {valid}')
  if (beta is None) != (name != 'delta'):
    raise ValueError(
      f'{name}: beta is {"None" if beta is None else "given"}; the delta rule needs its write '
      f'strength beta [batch, length, heads], the decay family takes none'
    )
  _check_shape(name, 'beta', beta, [(b, n, h)])
  _check_shape(name, 'initial_state', initial_state, [(b, h, dk, dv)])
  if precision not in common.PRECISIONS:
    raise ValueError(f'{name}: precision={precision!r}; valid: {", ".join(common.PRECISIONS)}')
  if backend not in (None,) + BACKENDS:
    raise ValueError(f'{name}: backend={backend!r}; valid: None, {", ".join(BACKENDS)}')

  documents = None
  if segment_ids is not None:
    ids = segments.check(segment_ids, b, n, name)
    real = segments.is_real(ids)
    documents = segments.document_index(ids)
    # A padding token writes nothing (k = v = 0, beta = 0, no decay) and reads nothing (q = 0,
    # so its output is 0); its gradients are then 0 through these products.
    pad = lambda x: None if x is None else x * real.reshape(real.shape + (1,) * (x.ndim - 2))
    q, k, v, log_decay, beta = (pad(x) for x in (q, k, v, log_decay, beta))

  lay = common.layout(q, v, log_decay, chunk_size)
  decay = 'none' if lay.dg == 0 else ('head' if lay.dg == 1 else 'feature')
  delta = beta is not None
  cfg = common.Config(lay, dtype, decay, delta, _delta_name(decay) if delta else name, lay.DV)
  xs = {
    'q': common.to_blocks(q, lay, lay.DK, dtype),
    'k': common.to_blocks(k, lay, lay.DK, dtype),
    'v': common.to_blocks(v, lay, lay.DV, dtype),
  }
  if log_decay is not None:
    xs['b'] = common.chunk_cumsum(log_decay, lay)
  if beta is not None:
    xs['beta'] = common.to_blocks(beta, lay, 1, F32)
  xs['d'] = common.chunk_documents(documents, lay)
  static = Static(kind, cfg, backend, precision, value_tile)
  out, st = _core(static, xs, common.state_blocks(initial_state, lay))
  return common.from_blocks(out, lay, dv), common.state_from_blocks(st, lay)


def _delta_name(decay: str) -> str:
  return {'none': 'delta', 'head': 'gated_delta', 'feature': 'kda'}[decay]


def entry(kind: Kind, name: str, decays, doc: str):
  """The public entry `<name>_chunked` of a kind of recurrence: the recurrences' one
  signature (docs/design.md), run per device under a mesh (`common.per_device`); `decays`
  as `run`'s, `doc` its docstring."""

  def chunked(
    q,
    k,
    v,
    log_decay=None,
    beta=None,
    *,
    initial_state=None,
    segment_ids=None,
    chunk_size: int = 64,
    precision: str = 'tf32',
    backend: Optional[str] = None,
    value_tile: Optional[int] = None,
  ):
    return run(
      kind,
      name,
      q,
      k,
      v,
      log_decay,
      beta,
      decays=decays,
      initial_state=initial_state,
      segment_ids=segment_ids,
      chunk_size=chunk_size,
      precision=precision,
      backend=backend,
      value_tile=value_tile,
    )

  chunked.__name__ = chunked.__qualname__ = f'{name}_chunked'
  chunked.__doc__ = doc
  return common.per_device(chunked)

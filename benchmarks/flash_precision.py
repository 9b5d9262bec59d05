r"""How exact is each exact-attention implementation on this device, per matmul precision.

    python -m benchmarks.flash_precision --out=docs/results --name=flash_precision_gpu

For each dtype, causality and implementation, under jax's default matmul
precision and (float32 only) under `jax.default_matmul_precision('highest')`:
the largest absolute error of the output and of the gradients of sum(out * g)
with respect to q, k and v (g random, in the inputs' dtype), each divided by the reference's largest
magnitude. The reference is the same rounded inputs in float64 on the host CPU
(dense softmax, gradients by autodiff). Implementations:

  dense        `jax.nn.dot_product_attention(implementation='xla')`, the peers'
               'exact' (XLA's dense attention);
  cudnn        the same with implementation='cudnn' (GPU, 16-bit dtypes only);
  chunked_xla  `softmax_chunked` with implementation='xla' (the flash loops in XLA);
  pallas       `softmax_chunked` with implementation='pallas' on a GPU: JAX's
               Triton flash kernel (`efficient_attn.ops.fused_softmax.pallas_gpu_attention`),
               in Pallas interpret mode off a GPU.

With --time_length > 0 each variant of --time_precisions is also timed, forward
+ backward, at that length and --time_batch (non-causal; median of --repeats
after one warm-up).
Writes <out>/<name>.json and .md. GPU (NVIDIA Ampere and later): float32 dots
at the default precision may run in TF32, in XLA and in Triton alike; this tool
measures what they do.
"""

import contextlib
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import attention_bench
from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import timing
from efficient_attn.mechanisms.softmax import chunked_softmax_attention
from efficient_attn.ops import fused_softmax

IMPLEMENTATIONS = ('dense', 'cudnn', 'chunked_xla', 'pallas')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_integer('length', 2048, 'sequence length of the error check', flag_values=fv)
  flags.DEFINE_integer('batch', 1, 'batch of the error check', flag_values=fv)
  flags.DEFINE_integer('heads', 8, 'heads', flag_values=fv)
  flags.DEFINE_integer('head_dim', 64, 'dimension per head', flag_values=fv)
  flags.DEFINE_list('dtypes', list(DTYPES), 'q, k, v dtypes', flag_values=fv)
  flags.DEFINE_list('implementations', list(IMPLEMENTATIONS), 'which to check', flag_values=fv)
  flags.DEFINE_list('causal', ['false', 'true'], 'causal flags to check', flag_values=fv)
  flags.DEFINE_integer(
    'time_length', 0, 'also time forward + backward at this length (0: no timing)', flag_values=fv
  )
  flags.DEFINE_integer('time_batch', 4, 'batch of the timing', flag_values=fv)
  flags.DEFINE_list(
    'time_precisions',
    ['default', 'highest'],
    'which precisions to time (the default one is what benchmarks.speed times too)',
    flag_values=fv,
  )
  flags.DEFINE_multi_string(
    'pallas_blocks',
    [],
    'also time the Pallas GPU kernel (default precision) with these '
    'block sizes: block_q,block_k,block_q_dkv,block_kv_dkv,block_q_dq,'
    'block_kv_dq (repeatable; JAX\'s defaults are 128,128,32,32,32,32)',
    flag_values=fv,
  )
  flags.DEFINE_integer('repeats', 10, 'timed calls per variant', lower_bound=1, flag_values=fv)
  common.define_output_flags(fv, out='benchmark_results', name='flash_precision')


def attention_fn(
  impl: str, causal: bool, scale: float, platform: str, blocks: Optional[Sequence[int]] = None
):
  """(q, k, v) -> out `[b, n, h, d]` of one implementation (`blocks`: the Pallas kernel's)."""
  if impl == 'dense':
    return lambda q, k, v: jax.nn.dot_product_attention(
      q, k, v, scale=scale, is_causal=causal, implementation='xla'
    )
  if impl == 'cudnn':
    return lambda q, k, v: jax.nn.dot_product_attention(
      q, k, v, scale=scale, is_causal=causal, implementation='cudnn'
    )
  if impl == 'chunked_xla':
    return lambda q, k, v: chunked_softmax_attention(q, k, v, causal=causal, scale=scale)
  if impl == 'pallas':
    return lambda q, k, v: fused_softmax.pallas_gpu_attention(
      q,
      k,
      v,
      None,
      causal,
      scale,
      interpret=platform != 'gpu',
      block_sizes=blocks and fused_softmax.gpu_block_sizes(q.shape[1], blocks),
    )
  raise ValueError(f'implementation {impl!r}; valid: {", ".join(IMPLEMENTATIONS)}')


def applies(impl: str, dtype: str, platform: str) -> Optional[str]:
  """Why `impl` is not checked for `dtype` on `platform` (None if it is)."""
  if impl == 'cudnn' and (platform != 'gpu' or dtype == 'float32'):
    return 'cuDNN runs on a GPU in 16-bit dtypes only'
  return None


def out_and_grads(fn):
  """A (q, k, v, g) -> (out, (dq, dk, dv)) of sum(out * g), not yet jitted."""

  def run(q, k, v, g):
    out, vjp = jax.vjp(fn, q, k, v)
    return out, vjp(g)

  return run


def reference(q, k, v, g, causal: bool, scale: float):
  """Float64 out and (dq, dk, dv) on the host CPU, as NumPy arrays."""

  def dense(q, k, v):
    s = jnp.einsum('bqhd,bkhd->bhqk', q, k) * scale
    if causal:
      n = q.shape[1]
      s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    return jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(s, axis=-1), v)

  with jax.enable_x64(True), jax.default_device(jax.devices('cpu')[0]):
    args = [jnp.asarray(np.asarray(x, np.float64)) for x in (q, k, v, g)]
    out, grads = jax.jit(out_and_grads(dense))(*args)
    return np.asarray(out), [np.asarray(x) for x in grads]


def relative_error(got, want) -> float:
  got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
  return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def precision_scope(precision: str):
  return (
    contextlib.nullcontext() if precision == 'default' else jax.default_matmul_precision(precision)
  )


def check(fv, platform: str) -> List[Dict[str, Any]]:
  """One record per (dtype, causal, implementation, precision) with its errors."""
  records = []
  scale = fv.head_dim**-0.5
  for dtype in fv.dtypes:
    q, k, v = attention_bench.random_qkv(
      0, fv.batch, fv.length, fv.heads, fv.head_dim, DTYPES[dtype]
    )
    g = jax.random.normal(jax.random.PRNGKey(1), q.shape, q.dtype)
    for causal in [c == 'true' for c in fv.causal]:
      want, want_grads = reference(q, k, v, g, causal, scale)
      for impl in fv.implementations:
        for precision in ('default', 'highest') if dtype == 'float32' else ('default',):
          if applies(impl, dtype, platform):
            continue
          rec = dict(dtype=dtype, causal=causal, implementation=impl, precision=precision)
          try:
            with precision_scope(precision):
              out, grads = jax.jit(out_and_grads(attention_fn(impl, causal, scale, platform)))(
                q, k, v, g
              )
              rec.update(
                out_error=relative_error(out, want),
                grad_error=max(relative_error(a, b) for a, b in zip(grads, want_grads)),
              )
          except Exception as e:  # pylint: disable=broad-except  (recorded, run continues)
            rec['failed'] = f'{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}'
          records.append(rec)
          if not fv.quiet:
            print(_line(rec), flush=True)
  return records


def time_variants(fv, records, platform: str) -> None:
  """Adds 'time_s' (forward + backward, non-causal, --time_length) to the non-causal records."""
  scale = fv.head_dim**-0.5
  for dtype in fv.dtypes:
    q, k, v = attention_bench.random_qkv(
      0, fv.time_batch, fv.time_length, fv.heads, fv.head_dim, DTYPES[dtype]
    )
    g = jax.random.normal(jax.random.PRNGKey(1), q.shape, q.dtype)
    for rec in records:
      if (
        rec['dtype'] != dtype
        or rec['causal']
        or 'failed' in rec
        or (rec['precision'] not in fv.time_precisions and not rec.get('timing_only'))
      ):
        continue
      try:
        with precision_scope(rec['precision']):
          fn = out_and_grads(
            attention_fn(rec['implementation'], False, scale, platform, rec.get('blocks'))
          )
          compiled = jax.jit(fn).lower(q, k, v, g).compile()
        rec.update(timing.time_compiled(compiled, (q, k, v, g), repeats=fv.repeats, budget_s=10.0))
      except Exception as e:  # pylint: disable=broad-except  (recorded, run continues)
        rec['time_failed'] = f'{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}'
      if not fv.quiet:
        print(_line(rec), flush=True)


def _label(rec) -> str:
  blocks = rec.get('blocks')
  return rec['implementation'] + (f" blocks {','.join(map(str, blocks))}" if blocks else '')


def _line(rec) -> str:
  parts = [rec.get('failed') or rec.get('time_failed') or '']
  if 'out_error' in rec:
    parts.append(f"out {rec['out_error']:.2e}, grads {rec['grad_error']:.2e}")
  if 'time_s' in rec:
    parts.append(f"time {output.fmt_time(rec['time_s'])}")
  return (
    f"{rec['dtype']:8s} {'causal' if rec['causal'] else 'full':6s} "
    f"{_label(rec):11s} {rec['precision']:7s} {', '.join(p for p in parts if p)}"
  )


def markdown(meta, records) -> str:
  timed = any('time_s' in r or 'time_failed' in r for r in records)
  notes = [
    f"batch {meta['batch']}, {meta['heads']} heads, head_dim {meta['head_dim']}, "
    f"length {meta['length']}; error: max |x - ref| / max |ref| against float64 on the "
    'host CPU (same rounded inputs); grads: the largest of dq, dk, dv (cotangent random)',
    "precision: jax's default matmul precision, or `jax.default_matmul_precision"
    "('highest')` around tracing",
    f"command: {meta['command']}",
  ]
  if timed:
    notes.insert(
      2,
      f"time: forward + backward, non-causal, batch {meta['time_batch']}, "
      f"length {meta['time_length']}, median of up to {meta['repeats']} calls",
    )
  headers = ['dtype', 'causal', 'implementation', 'precision', 'out error', 'grad error']
  headers += ['time'] if timed else []
  rows = []
  for r in records:
    row = [r['dtype'], 'yes' if r['causal'] else 'no', _label(r), r['precision']]
    if 'failed' in r:
      row += [f"failed: {r['failed']}", '']
    elif r.get('timing_only'):
      row += ['(timed only)', '']
    else:
      row += [f"{r['out_error']:.2e}", f"{r['grad_error']:.2e}"]
    if timed:
      row.append(output.fmt_time(r.get('time_s')) or r.get('time_failed', ''))
    rows.append(row)
  return (
    output.header(
      'Exact attention: error against float64, per implementation', meta['device_line'], notes
    )
    + '\n'
    + output.table(headers, rows)
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  fv = common.parse_flags(define_flags, argv, __doc__)
  with common.flag_errors():
    common.check_choices('implementations', fv.implementations, IMPLEMENTATIONS)
    common.check_choices('dtypes', fv.dtypes, DTYPES)
    try:
      fv.pallas_blocks = [[int(b) for b in item.split(',')] for item in fv.pallas_blocks]
    except ValueError:
      fv.pallas_blocks = [[]]
    if any(len(blocks) != 6 for blocks in fv.pallas_blocks):
      raise ValueError(
        '--pallas_blocks: six integers, block_q,block_k,block_q_dkv,'
        'block_kv_dkv,block_q_dq,block_kv_dq'
      )
    common.check_choices('time_precisions', fv.time_precisions, ('default', 'highest'))
    common.check_choices('causal', fv.causal, ('true', 'false'))
  info = machine.device_info()
  records = check(fv, info['platform'])
  if fv.time_length:
    for dtype in fv.dtypes:  # block-size variants: timed only
      records += [
        dict(
          dtype=dtype,
          causal=False,
          implementation='pallas',
          precision='default',
          blocks=blocks,
          timing_only=True,
        )
        for blocks in fv.pallas_blocks
      ]
    time_variants(fv, records, info['platform'])
  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
    length=fv.length,
    batch=fv.batch,
    heads=fv.heads,
    head_dim=fv.head_dim,
    time_length=fv.time_length,
    time_batch=fv.time_batch,
    repeats=fv.repeats,
    command=output.command('benchmarks.flash_precision', argv),
  )
  data = dict(meta=meta, records=records)
  output.finish(fv.out, fv.name, data, markdown(meta, records), quiet=fv.quiet)
  return data


if __name__ == '__main__':
  main()

r"""How exact are the gated recurrences' chunk forms in float32 and bfloat16.

    python -m benchmarks.gated_precision --out=docs/results --name=gated_bf16_error

For each of the five recurrences (retention, GLA, Mamba-2, DeltaNet, Gated DeltaNet), each
dtype of q, k, v and each implementation: the largest absolute error of the output, of the
final state and of the gradients of sum(out * r) + sum(state * r') (r, r' random) with
respect to q, k, v, the log-decays and beta, each divided by the reference's largest
magnitude. The reference is the float64 token recurrence (`exact_scan`) on
the same rounded inputs (q, k, v rounded to bfloat16 once, then fed to every dtype and to
the reference), so the error is the computation's own. Implementations:

  xla     the chunk form in XLA (`gated.gated_chunked`, `delta.delta_chunked`):
          with bfloat16 q, k, v its matmuls take bfloat16 operands, accumulated in float32;
  pallas  the Pallas kernels (`efficient_attn.ops.kernels`), interpreted off a GPU or TPU
          (slow: off by default there).

The recurrences' inputs are drawn as the mechanisms make them: retention's fixed decays
log(1 - 2^(-5 - h)) and keys scaled by 1/sqrt(dk); GLA's per-feature log_sigmoid(z) / 16;
Mamba-2's -A dt (A in [1, 16], dt in [0.001, 0.1]) with keys scaled by dt; DeltaNet's
L2-normalised q and k (q by 1/sqrt(dk)) and beta = sigmoid(z); Gated DeltaNet's as
DeltaNet's with -A dt (A in [0, 16]). Writes <out>/<name>.json and .md.
"""

from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from efficient_attn.ops import delta
from efficient_attn.ops import gated
from efficient_attn.ops import kernels

RECURRENCES = ('retention', 'gla', 'mamba2', 'deltanet', 'gated_deltanet')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
IMPLEMENTATIONS = ('xla', 'pallas')
DELTA = ('deltanet', 'gated_deltanet')


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_integer('length', 1024, 'sequence length', flag_values=fv)
  flags.DEFINE_integer('batch', 1, 'batch', flag_values=fv)
  flags.DEFINE_integer('heads', 4, 'heads', flag_values=fv)
  flags.DEFINE_integer('head_dim', 64, 'dk = dv per head', flag_values=fv)
  flags.DEFINE_integer('chunk_size', 64, 'chunk of the chunk forms', flag_values=fv)
  flags.DEFINE_list('recurrences', list(RECURRENCES), 'which to check', flag_values=fv)
  flags.DEFINE_list('dtypes', list(DTYPES), 'q, k, v dtypes', flag_values=fv)
  flags.DEFINE_list(
    'implementations',
    ['xla'],
    "which to check: xla, pallas ('pallas' is interpreted off a GPU or TPU)",
    flag_values=fv,
  )
  common.define_output_flags(fv, out='benchmark_results', name='gated_precision')


def inputs(
  name: str, batch: int, length: int, heads: int, dim: int, seed: int = 0
) -> Dict[str, Any]:
  """The recurrence's inputs {q, k, v, g, beta} (float64 NumPy; g, beta None where unused),
  q, k, v rounded to bfloat16 values."""
  rng = np.random.default_rng(seed)
  shape = (batch, length, heads, dim)
  q, k, v = (rng.standard_normal(shape) for _ in range(3))
  z = rng.standard_normal((batch, length, heads, 1))
  dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), (batch, length, heads, 1)))
  g = beta = None
  if name == 'retention':
    g = np.broadcast_to(np.log1p(-(2.0 ** (-5.0 - np.arange(heads))))[:, None], z.shape)
    k = k / np.sqrt(dim)
  elif name == 'gla':
    g = -np.logaddexp(0.0, -rng.standard_normal(shape)) / 16.0
    q = q / np.sqrt(dim)
  elif name == 'mamba2':
    g = -rng.uniform(1.0, 16.0, (1, 1, heads, 1)) * dt
    k = k * dt
  else:
    l2 = lambda x: x / np.sqrt(np.sum(x * x, -1, keepdims=True) + 1e-6)
    q, k = l2(q) / np.sqrt(dim), l2(k)
    beta = 1.0 / (1.0 + np.exp(-z[..., 0]))
    if name == 'gated_deltanet':
      g = -rng.uniform(0.0, 16.0, (1, 1, heads, 1)) * dt
  rounded = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
  return dict(q=rounded(q), k=rounded(k), v=rounded(v), g=g, beta=beta)


def exact_scan(q, k, v, g=None, beta=None, state=None, chunk_size=None):
  """The decay recurrence (beta None) or the delta rule token by token in the inputs' own
  dtype (float64 under `jax.enable_x64`): `gated.gated_step` and
  `delta.delta_step` without their float32 casts. Shapes as `gated.scan_tokens`;
  returns (out `[b, n, h, dv]`, final state `[b, h, dk, dv]`)."""
  del chunk_size
  b, _, h, dk = q.shape
  s0 = jnp.zeros((b, h, dk, v.shape[-1]), q.dtype) if state is None else state

  def step(s, x):
    q_t, k_t, v_t, g_t, beta_t = x
    if g_t is not None:
      s = jnp.exp(g_t)[..., None] * s
    if beta_t is None:
      u = v_t
    else:
      u = beta_t[..., None] * (v_t - jnp.einsum('bhkv,bhk->bhv', s, k_t))
    s = s + k_t[..., :, None] * u[..., None, :]
    return s, jnp.einsum('bhk,bhkv->bhv', q_t, s)

  xs = tuple(None if x is None else jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta))
  s, out = jax.lax.scan(step, s0, xs)
  return jnp.moveaxis(out, 0, 1), s


def core(name: str, impl: str):
  """The recurrence's form: (q, k, v, g, beta, state, chunk_size) -> (out, state)."""
  if impl == 'reference':
    return exact_scan
  if impl == 'pallas':
    return kernels.delta_chunked if name in DELTA else kernels.decay_chunked
  return delta.delta_chunked if name in DELTA else gated.gated_chunked


def out_and_grads(fn, chunk_size: int):
  """A jitted (args, cotangents) -> ((out, state), {name: gradient})."""

  def run(args, cotangents):
    names = [n for n in ('q', 'k', 'v', 'g', 'beta') if args[n] is not None]

    def call(*xs):
      given = {'g': None, 'beta': None, **dict(zip(names, xs))}
      positional = [given[n] for n in ('q', 'k', 'v', 'g', 'beta')]  # the kernels: log_decay
      return fn(*positional, chunk_size=chunk_size)

    out, vjp = jax.vjp(call, *(args[n] for n in names))
    return out, dict(zip(names, vjp(cotangents)))

  return jax.jit(run)


def relative_error(got, want) -> float:
  got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
  return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def check(fv) -> List[Dict[str, Any]]:
  """One record per (recurrence, dtype, implementation) with its errors."""
  records = []
  for name in fv.recurrences:
    x = inputs(name, fv.batch, fv.length, fv.heads, fv.head_dim)
    x.update(
      {
        n: None if x[n] is None else np.asarray(x[n], np.float32).astype(np.float64)
        for n in ('g', 'beta')
      }
    )  # as every form reads them: float32
    rng = np.random.default_rng(1)
    cotangents = (
      rng.standard_normal(x['v'].shape),
      rng.standard_normal((fv.batch, fv.heads, fv.head_dim, fv.head_dim)),
    )
    with jax.enable_x64(True), jax.default_device(jax.devices('cpu')[0]):
      f64 = {n: None if a is None else jnp.asarray(a, jnp.float64) for n, a in x.items()}
      (out, state), grads = out_and_grads(core(name, 'reference'), fv.chunk_size)(
        f64, tuple(jnp.asarray(c) for c in cotangents)
      )
      want = dict(
        out=np.asarray(out),
        state=np.asarray(state),
        **{f'd{n}': np.asarray(a) for n, a in grads.items()},
      )
    for dtype in fv.dtypes:
      for impl in fv.implementations:
        args = {
          n: None if a is None else jnp.asarray(a, DTYPES[dtype] if n in 'qkv' else jnp.float32)
          for n, a in x.items()
        }
        rec = dict(recurrence=name, dtype=dtype, implementation=impl)
        try:
          (out, state), grads = out_and_grads(core(name, impl), fv.chunk_size)(
            args, tuple(jnp.asarray(c, jnp.float32) for c in cotangents)
          )
          got = dict(out=out, state=state, **{f'd{n}': a for n, a in grads.items()})
          errors = {key: relative_error(got[key], want[key]) for key in want}
          rec.update(
            out_error=errors['out'],
            state_error=errors['state'],
            grad_error=max(v for key, v in errors.items() if key.startswith('d')),
            grad_errors={key: v for key, v in errors.items() if key.startswith('d')},
          )
        except Exception as e:  # pylint: disable=broad-except  (recorded, run continues)
          rec['failed'] = f'{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}'
        records.append(rec)
        if not fv.quiet:
          print(_line(rec), flush=True)
  return records


def _line(rec) -> str:
  if 'failed' in rec:
    body = rec['failed']
  else:
    body = (
      f"out {rec['out_error']:.2e}, state {rec['state_error']:.2e}, grads {rec['grad_error']:.2e}"
    )
  return f"{rec['recurrence']:15s} {rec['dtype']:8s} {rec['implementation']:6s} {body}"


def markdown(meta, records) -> str:
  notes = [
    f"batch {meta['batch']}, {meta['heads']} heads, dk = dv = {meta['head_dim']}, length "
    f"{meta['length']}, chunk {meta['chunk_size']}; error: max |x - ref| / max |ref| against "
    'the float64 token recurrence on the same rounded inputs (q, k, v rounded to bfloat16 '
    'once, for every dtype); grads: the largest over q, k, v, log-decays and beta '
    '(cotangents random), each in the json',
    'bfloat16: the matmuls take bfloat16 operands accumulated in float32; states, decays, '
    'cumulative sums and the triangular inverse are float32',
    f"command: {meta['command']}",
  ]
  headers = ['recurrence', 'dtype', 'implementation', 'out error', 'state error', 'grad error']
  rows = []
  for r in records:
    row = [r['recurrence'], r['dtype'], r['implementation']]
    if 'failed' in r:
      row += [f"failed: {r['failed']}", '', '']
    else:
      row += [f"{r['out_error']:.2e}", f"{r['state_error']:.2e}", f"{r['grad_error']:.2e}"]
    rows.append(row)
  return (
    output.header('Gated recurrences: error against float64, per dtype', meta['device_line'], notes)
    + '\n'
    + output.table(headers, rows)
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  fv = common.parse_flags(define_flags, argv, __doc__)
  with common.flag_errors():
    common.check_choices('recurrences', fv.recurrences, RECURRENCES)
    common.check_choices('dtypes', fv.dtypes, DTYPES)
    common.check_choices('implementations', fv.implementations, IMPLEMENTATIONS)
  info = machine.device_info()
  records = check(fv)
  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
    length=fv.length,
    batch=fv.batch,
    heads=fv.heads,
    head_dim=fv.head_dim,
    chunk_size=fv.chunk_size,
    command=output.command('benchmarks.gated_precision', argv),
  )
  data = dict(meta=meta, records=records)
  output.finish(fv.out, fv.name, data, markdown(meta, records), quiet=fv.quiet)
  return data


if __name__ == '__main__':
  main()

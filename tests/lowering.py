"""Lowering and compiling the Pallas kernels for a GPU or a TPU from a CPU host: what
tests/ops/test_kernel_lowering.py and tests/layers/test_layer_lowering.py share.

A kernel is lowered for the platform it is exported or compiled for, whatever the host
(issue 67): `jax.export` for 'cuda' must hold Triton's custom call, for 'tpu' Mosaic's, so
an interpreted fallback shows as a module without them.

Run as a script, this module compiles the recurrence kernels' forward and backward ahead
of time for TPU topologies with the `libtpu` wheel (no TPU attached), prints a table and
writes the records (memory_analysis's sizes, or the compiler's error) as JSON:

    pip install --target .venv/libtpu 'libtpu==0.0.42.1'   # once; .ci/run does it
    python tests/lowering.py OUT.json [--all]

The tests' 12 cases by default, every case with --all (`compile_cases`). The test runs it
in a process of its own (`compile_in_subprocess`): libtpu's TPU plugin, its log lines and a
possible abort stay out of the test workers.
"""

import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from typing import Optional

import jax
import jax.numpy as jnp

# The custom call each platform's kernels lower to.
CUSTOM_CALL = {'cuda': '__gpu$xla.gpu.triton', 'tpu': 'tpu_custom_call'}
# Triton's custom call is not on jax.export's list of stable ones (Triton's IR has no
# compatibility promise), so exporting it needs this check disabled.
DISABLED_CHECKS = [jax.export.DisabledSafetyCheck.custom_call(CUSTOM_CALL['cuda'])]

# The recurrence kernels by kind: (the package whose `Cores.pallas` runs it, the last dim of
# the log-decays: 1 per head, 'dk' per key feature, whether it takes beta), with the
# mechanisms that run each. The tests call the kernels through `ops.gated`'s and `ops.delta`'s
# entries, as the mechanisms do (`kernel_forward_backward`), whatever the kernels' files.
KERNELS = {
  'scalar_decay': ('gated', 1, False),  # retention, Mamba-2
  'vector_decay': ('gated', 'dk', False),  # GLA
  'delta': ('delta', 1, True),  # Gated DeltaNet (DeltaNet: no decay)
}
DTYPES = (jnp.float32, jnp.bfloat16)
HEAD_DIMS = (64, 128)
CHUNK = 64


def kernel_entry(kind: str):
  """The Pallas chunk form that `ops.gated` or `ops.delta` runs for kernel `kind`."""
  from efficient_attn.ops import delta  # pylint: disable=g-import-not-at-top
  from efficient_attn.ops import gated  # pylint: disable=g-import-not-at-top

  return {'gated': gated.DECAY, 'delta': delta.DELTA}[KERNELS[kind][0]].pallas


def kernel_inputs(kind: str, *, length: int, dim: int, dtype, batch=1, heads=2, sharding=None):
  """Abstract (q, k, v, log_decay, beta) of a call of kernel `kind` (beta None for the
  decay family)."""
  spec = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=sharding)
  _, width, has_beta = KERNELS[kind]
  qkv = spec((batch, length, heads, dim), dtype)
  log_decay = spec((batch, length, heads, dim if width == 'dk' else width), jnp.float32)
  beta = spec((batch, length, heads), jnp.float32) if has_beta else None
  return qkv, qkv, qkv, log_decay, beta


def kernel_forward_backward(kind: str, *, inference: bool = True):
  """f(q, k, v, log_decay, beta) -> (grads of sum(out) + sum(final state)) and, with
  `inference`, the forward alone (out, final state): a kernel's three programs (the
  forward, the forward that keeps the backward's residuals, the backward) in one."""
  entry = kernel_entry(kind)

  def run(q, k, v, g, beta):
    return entry(q, k, v, g, beta, chunk_size=CHUNK)

  def loss(*args):
    out, state = run(*args)
    return jnp.sum(out.astype(jnp.float32)) + jnp.sum(state)

  argnums = (0, 1, 2, 3, 4) if KERNELS[kind][2] else (0, 1, 2, 3)

  def f(*args):
    grads = jax.grad(loss, argnums=argnums)(*args)
    return (run(*args), grads) if inference else grads

  return f


def jit_forward_backward(kind: str):
  """`kernel_forward_backward(kind)` jitted, for `export_text`."""
  return jax.jit(kernel_forward_backward(kind))


def jit_forward_and_grads(fn, argnums):
  """jitted f(*args) -> (fn(*args), grads of sum(fn(*args)) for `argnums`)."""
  loss = lambda *args: jnp.sum(fn(*args).astype(jnp.float32))
  return jax.jit(lambda *args: (fn(*args), jax.grad(loss, argnums=argnums)(*args)))


def sds(shape, dtype=jnp.float32):
  """An abstract array (the exports need no data)."""
  return jax.ShapeDtypeStruct(shape, dtype)


def export_text(jitted, platform: str, *args) -> str:
  """The StableHLO text of `jax.export` of `jitted(*args)` for `platform` ('cuda', 'tpu'),
  or 'ERROR ' and the export's error in one line."""
  try:
    exported = jax.export.export(jitted, platforms=[platform], disabled_checks=DISABLED_CHECKS)
    return exported(*args).mlir_module()
  except Exception as e:  # pylint: disable=broad-except
    return f'ERROR {type(e).__name__}: {" ".join(str(e).split())[:300]}'


def kernel_calls(text: str, platform: str) -> int:
  """How many custom calls of `platform`'s kernels a module's text holds."""
  return text.count(f'stablehlo.custom_call @{CUSTOM_CALL[platform]}(')


def problems(case: str, text: str, platform: str, want: int) -> list:
  """[one line] if `export_text`'s `text` is an error or holds fewer than `want` of the
  platform's kernel calls, else []."""
  if text.startswith('ERROR '):
    return [f'{case}: {text[6:]}']
  calls = kernel_calls(text, platform)
  if calls < want:
    return [
      f'{case}: {calls} {CUSTOM_CALL[platform]} calls, want >= {want} '
      f'(a kernel interpreted instead of lowered?)'
    ]
  return []


# ----------------------------------------------------------------------------
# Ahead-of-time compile for TPU (the script).
# ----------------------------------------------------------------------------

# The libtpu that jax[tpu]==0.10.2 pins (pyproject's `tpu-compile` extra; .ci/run installs it
# into LIBTPU_SITE, apart from the venv, so that no other test process loads it). Its
# wheels need Python >= 3.11.
LIBTPU = 'libtpu==0.0.42.1'
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBTPU_SITE = os.path.join(ROOT, '.venv', 'libtpu')
# TPU topologies (jax.experimental.topologies) and each chip's HBM in bytes.
TOPOLOGIES = {'v5e:2x2': 16 * 2**30, 'v6e:2x2': 32 * 2**30}
LENGTHS = (8192, 32768, 131072)
COMPILE_HEADS = 4
# A TPU type stops libtpu from asking a cloud metadata server which TPU this host has; the
# second lets it load beside another process that holds /tmp/libtpu_lockfile (another
# compile on this machine): no TPU is opened, so they do not conflict.
LIBTPU_ENV = {'TPU_ACCELERATOR_TYPE': 'v5litepod-4', 'ALLOW_MULTIPLE_LIBTPU_LOAD': '1'}
MEMORY_FIELDS = ('argument_size_in_bytes', 'output_size_in_bytes', 'temp_size_in_bytes')


def compile_cases(everything: bool = False):
  """(topology, kind, length, dim, dtype name) of the TPU compiles. `everything`: each
  topology x kernel x length x head dim x dtype (72, minutes of CPU). Else the tests' 12,
  about 5 CPU-seconds each: every kernel in float32 at head dim 128 on v5e (the smaller
  VMEM and HBM) at each length, and in bfloat16 at head dim 64 on v6e at the longest."""
  if everything:
    for topology in TOPOLOGIES:
      for kind in KERNELS:
        for dim in HEAD_DIMS:
          for length in LENGTHS:
            for dtype in DTYPES:
              yield topology, kind, length, dim, jnp.dtype(dtype).name
    return
  for kind in KERNELS:
    for length in LENGTHS:
      yield 'v5e:2x2', kind, length, 128, 'float32'
    yield 'v6e:2x2', kind, LENGTHS[-1], 64, 'bfloat16'


def compile_one(device, kind, length, dim, dtype) -> dict:
  """Compiles kernel `kind`'s forward + backward for `device` (a topology's TPU):
  {'kernel_calls', memory_analysis's fields, 'seconds', 'cpu_seconds'} or {'error': its
  first words, ...}."""
  from jax.sharding import SingleDeviceSharding  # pylint: disable=g-import-not-at-top

  args = kernel_inputs(
    kind,
    length=length,
    dim=dim,
    dtype=jnp.dtype(dtype),
    heads=COMPILE_HEADS,
    sharding=SingleDeviceSharding(device),
  )
  start, cpu = time.time(), _cpu_seconds()
  try:
    lowered = jax.jit(kernel_forward_backward(kind, inference=False)).lower(*args)
    record = {'kernel_calls': kernel_calls(lowered.as_text(), 'tpu')}
    memory = lowered.compile().memory_analysis()
    record.update({name: int(getattr(memory, name)) for name in MEMORY_FIELDS})
  except Exception as e:  # pylint: disable=broad-except
    record = {'error': f'{type(e).__name__}: {" ".join(str(e).split())[:600]}'}
  record.update(seconds=round(time.time() - start, 2), cpu_seconds=round(_cpu_seconds() - cpu, 2))
  return record


def _cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def main(out_path: str, everything: bool = False):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  records, start = [], time.time()
  devices = {name: topologies.get_topology_desc(name, 'tpu').devices[0] for name in TOPOLOGIES}
  for topology, kind, length, dim, dtype in compile_cases(everything):
    record = dict(topology=topology, kind=kind, length=length, dim=dim, dtype=dtype)
    record.update(compile_one(devices[topology], kind, length, dim, dtype))
    records.append(record)
    print(json.dumps(record), flush=True)
  with open(out_path, 'w') as f:
    json.dump({'seconds': round(time.time() - start, 1), 'records': records}, f, indent=1)


# ----------------------------------------------------------------------------
# Running the script from a test.
# ----------------------------------------------------------------------------


def libtpu_site() -> Optional[str]:
  """The folder that holds libtpu for the compile: $LIBTPU_SITE, else LIBTPU_SITE; '' if
  this interpreter imports it from its own site-packages; None where it is nowhere."""
  for folder in (os.environ.get('LIBTPU_SITE'), LIBTPU_SITE):
    if folder and os.path.isdir(os.path.join(folder, 'libtpu')):
      return folder
  return '' if importlib.util.find_spec('libtpu') else None


def compile_in_subprocess(site: str, out_path: str, code_root: str, timeout: float = 1800):
  """Runs this script (the tests' cases) in a process of its own, with libtpu from `site`
  and `efficient_attn` from `code_root` first on its path (libtpu's log lines, its TPU
  plugin and a possible abort stay out of the test process); its records."""
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', 'JAX_PLATFORMS')}
  path = [p for p in (site, code_root, os.environ.get('PYTHONPATH')) if p]
  env.update(PYTHONPATH=os.pathsep.join(path), **LIBTPU_ENV)
  proc = subprocess.run(
    [sys.executable, os.path.abspath(__file__), out_path],
    env=env,
    cwd=code_root,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  if proc.returncode:
    raise RuntimeError(f'the TPU compile exited {proc.returncode}: {proc.stderr[-3000:]}')
  with open(out_path) as f:
    return json.load(f)['records']


def compile_problems(records) -> list:
  """The one-line problems of the compile records: a failed compile, fewer than 2 kernel
  calls (the forward keeping residuals and the backward), more HBM than the chip has."""
  problems = []
  for r in records:
    case = f"{r['topology']} {r['kind']} n={r['length']} d={r['dim']} {r['dtype']}"
    if 'error' in r:
      problems.append(f'{case}: {r["error"]}')
    elif r['kernel_calls'] < 2:
      problems.append(f'{case}: {r["kernel_calls"]} tpu_custom_call, want >= 2')
    elif hbm_bytes(r) > TOPOLOGIES[r['topology']]:
      problems.append(f'{case}: {gib(hbm_bytes(r))} of HBM, more than the chip has')
  return problems


def hbm_bytes(record) -> int:
  return sum(record[name] for name in MEMORY_FIELDS)


def gib(n: float) -> str:
  return f'{n / 2**30:.2f} GiB' if n >= 2**30 else f'{n / 2**20:.1f} MiB'


def table(records) -> str:
  """One line per record: the case, then its memory or its error."""
  lines = []
  for r in records:
    case = f"{r['topology']} {r['kind']} n={r['length']} d={r['dim']} {r['dtype']}"
    if 'error' in r:
      lines.append(f'{case}: FAILED {r["error"]}')
    else:
      memory = ', '.join(f'{name.split("_")[0]} {gib(r[name])}' for name in MEMORY_FIELDS)
      lines.append(f'{case}: {memory}; {r["kernel_calls"]} kernel calls; {r["cpu_seconds"]} cpu s')
  return '\n'.join(lines)


if __name__ == '__main__':
  if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ['--all']):
    sys.exit('usage: python tests/lowering.py OUT.json [--all]')
  for name, value in LIBTPU_ENV.items():
    os.environ.setdefault(name, value)
  sys.path.append(ROOT)  # efficient_attn, unless PYTHONPATH names another checkout
  if libtpu_site():  # before JAX looks for its TPU plugin, at its first backend call
    sys.path.insert(0, libtpu_site())
  main(sys.argv[1], everything=sys.argv[2:] == ['--all'])
  with open(sys.argv[1]) as f:
    print(table(json.load(f)['records']))

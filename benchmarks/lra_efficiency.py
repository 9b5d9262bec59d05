r"""The Long Range Arena's efficiency table: training steps/s and memory, relative to softmax.

    python -m benchmarks.lra_efficiency --out=docs/results --name=lra_efficiency
    python -m benchmarks.lra_efficiency --mechanisms=softmax,linear --lengths=1024,2048 \
        --batch_size=32

LRA's setting (Tay et al. 2021, Table 2): byte-level text classification with
LRA's Text model (`configs/lra/text.py`: 4 layers, width 256, 4 heads, MLP
1024) at lengths 1K, 2K, 3K and 4K, batch 32, every mechanism at its declared
defaults. For each (mechanism, length) this builds the config's model, optimiser
and jitted train step, feeds one synthetic batch of random bytes (no data is
read: only the speed matters), and times --steps steps after a warm-up step.
Memory is XLA's compiled memory analysis of the train step (arguments + outputs
+ temporaries: the peak the step needs). Both are given relative to softmax at
the same length, as in LRA's table. A mechanism that cannot run at a length
(a fixed context, an option the length does not fit) or exceeds
--memory_budget_gb is reported with the reason. Writes <out>/<name>.json, .md
and <name>.png (steps/s against length). Each point is also written to
<out>/<name>.partial.json as it is measured, so an interrupted run goes on
where it stopped when the same command is run again.
"""

import json
import os
import sys
import time
from typing import Any, Dict, Optional, Sequence

import jax
import numpy as np

from benchmarks import attention_bench
from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import train_speed
from benchmarks import xla_stats
import efficient_attn as ea

LENGTHS = (1024, 2048, 3072, 4096)
CLOCKS = {'wall': time.perf_counter, 'process': time.process_time}
# LRA's Table 2 (Tay et al. 2021): steps/s at 1K, 2K, 3K, 4K with the speed relative to the
# Transformer as printed in brackets, and peak memory in GB per device; byte-level text,
# batch 32, 4x4 TPU v3. Sparse Trans. and Longformer are not in it. (Synthesizer's 3K
# entry, 6.6 steps/s, faster than its 2K, is printed so.)
PUBLISHED = {
  'softmax': ('Transformer', (8.1, 4.9, 2.3, 1.4), (1.0, 1.0, 1.0, 1.0), (0.85, 2.65, 5.51, 9.48)),
  'local': (
    'Local Attention',
    (9.2, 8.4, 7.4, 7.4),
    (1.1, 1.7, 3.2, 5.3),
    (0.42, 0.76, 1.06, 1.37),
  ),
  'linformer': ('Linformer', (9.3, 9.1, 8.5, 7.7), (1.2, 1.9, 3.7, 5.5), (0.37, 0.55, 0.99, 0.99)),
  'reformer': ('Reformer', (4.4, 2.2, 1.5, 1.1), (0.5, 0.4, 0.7, 0.8), (0.48, 0.99, 1.53, 2.28)),
  'sinkhorn': (
    'Sinkhorn Trans.',
    (9.1, 7.9, 6.6, 5.3),
    (1.1, 1.6, 2.9, 3.8),
    (0.47, 0.83, 1.13, 1.48),
  ),
  'synthesizer': (
    'Synthesizer',
    (8.7, 5.7, 6.6, 1.9),
    (1.1, 1.2, 2.9, 1.4),
    (0.65, 1.98, 4.09, 6.99),
  ),
  'bigbird': ('BigBird', (7.4, 3.9, 2.7, 1.5), (0.9, 0.8, 1.2, 1.1), (0.77, 1.49, 2.18, 2.88)),
  'linear': ('Linear Trans.', (9.1, 9.3, 8.6, 7.8), (1.1, 1.9, 3.7, 5.6), (0.37, 0.57, 0.80, 1.03)),
  'performer': ('Performer', (9.5, 9.4, 8.7, 8.0), (1.2, 1.9, 3.8, 5.7), (0.37, 0.59, 0.82, 1.06)),
}
PUBLISHED_SOURCE = (
  "Tay et al. (2021), Long Range Arena, Table 2 (arXiv:2011.04006): "
  "byte-level text, batch 32, 4x4 TPU v3; memory per TPU device"
)


def published_markdown(mechanisms) -> str:
  """LRA's Table 2 for the mechanisms both have: speed as printed, memory relative to the
  Transformer computed here from the printed GB."""
  rows = [m for m in mechanisms if m in PUBLISHED]
  base = PUBLISHED['softmax'][3]
  heads = ['mechanism', 'LRA name'] + [f'{k}K' for k in (1, 2, 3, 4)]
  speed = [[m, PUBLISHED[m][0]] + [f'{v:.1f}x' for v in PUBLISHED[m][2]] for m in rows]
  memory = [
    [m, PUBLISHED[m][0]] + [f'{g / b:.2f}x' for g, b in zip(PUBLISHED[m][3], base)] for m in rows
  ]
  absolute = [
    [m, PUBLISHED[m][0]] + [f'{v} / {g} GB' for v, g in zip(*PUBLISHED[m][1::2])] for m in rows
  ]
  return '\n'.join(
    [
      '## Published (LRA, not measured here)',
      '',
      f'Source: {PUBLISHED_SOURCE}.',
      '',
      'Steps per second relative to the Transformer, as printed:',
      '',
      output.table(heads, speed),
      '',
      'Memory relative to the Transformer (computed here from the printed GB):',
      '',
      output.table(heads, memory),
      '',
      'As printed (steps/s / GB per device):',
      '',
      output.table(heads, absolute),
    ]
  )


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_string(
    'mechanisms', '', 'comma-separated (default: every registered one)', flag_values=fv
  )
  flags.DEFINE_string('lengths', ','.join(map(str, LENGTHS)), 'sequence lengths', flag_values=fv)
  flags.DEFINE_integer('batch_size', 32, 'global batch (LRA: 32)', flag_values=fv)
  flags.DEFINE_integer('steps', 3, 'timed train steps per point', flag_values=fv)
  flags.DEFINE_string(
    'size', 'base', "configs/lra/text.py size ('base' = LRA's model)", flag_values=fv
  )
  flags.DEFINE_float(
    'memory_budget_gb',
    0.0,
    "skip points above this many GB by XLA's memory analysis (0: 85% of RAM)",
    flag_values=fv,
  )
  flags.DEFINE_enum(
    'clock',
    'wall',
    CLOCKS,
    "wall: elapsed time; process: this process's "
    'CPU time (all threads), which other processes on a loaded machine do '
    'not inflate; on one pinned core the two agree when the core is quiet',
    flag_values=fv,
  )
  common.define_output_flags(fv, out='benchmark_results', name='lra_efficiency')


def text_config(mechanism: str, length: int, size: str, batch_size: int):
  from configs.lra import text  # pylint: disable=g-import-not-at-top

  config = text.get_config(f'mechanism={mechanism},max_length={length},size={size}')
  config.dataset.batch_size = batch_size
  return config


def measure_point(
  mechanism: str,
  length: int,
  size: str,
  batch_size: int,
  steps: int,
  budget_bytes: Optional[int],
  clock: str = 'wall',
) -> Dict[str, Any]:
  """{steps_per_s, memory_bytes} of one (mechanism, length), or {error}; steps timed by
  `clock` (a name in CLOCKS)."""
  config = text_config(mechanism, length, size, batch_size)
  rng = np.random.default_rng(0)
  batch = dict(
    inputs=rng.integers(1, 257, size=(batch_size, length)).astype(np.int32),
    label=rng.integers(0, 2, size=(batch_size,)).astype(np.int32),
    mask=np.ones((batch_size,), np.float32),
  )
  try:
    compiled, state, batch, params = train_speed.compiled_train_step(config, batch)
  except ValueError as e:  # includes validate.ConfigError: a config the trainer refuses
    return dict(error=str(e).splitlines()[0])
  except Exception as e:  # pylint: disable=broad-except  (a shape the mechanism refuses)
    return dict(error=f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}')
  memory = (xla_stats.memory(compiled) or {}).get('total')
  if budget_bytes and memory and memory > budget_bytes:
    return dict(
      error=f"needs {output.fmt_bytes(memory)} by XLA's memory analysis", memory_bytes=memory
    )
  state, metrics = compiled(state, batch)  # warm-up
  jax.block_until_ready((state, metrics))
  now = CLOCKS[clock]
  start = now()
  for _ in range(steps):
    state, metrics = compiled(state, batch)
  jax.block_until_ready((state, metrics))
  seconds = (now() - start) / steps
  return dict(steps_per_s=1.0 / seconds, step_s=seconds, memory_bytes=memory, params=params)


def relative(points, mechanisms, lengths, key: str, invert: bool = False):
  """{mechanism: {length: value / softmax's value}}."""
  out = {}
  for m in mechanisms:
    for n in lengths:
      mine, base = points[m][n].get(key), points.get('softmax', {}).get(n, {}).get(key)
      out.setdefault(m, {})[n] = mine / base if mine and base else None
  return out


def markdown(meta, points, mechanisms, lengths) -> str:
  speed = relative(points, mechanisms, lengths, 'steps_per_s')
  memory = relative(points, mechanisms, lengths, 'memory_bytes')

  def row(m, table, fmt):
    return [m] + [fmt(table[m][n]) if table[m][n] is not None else None for n in lengths]

  heads = ['mechanism'] + [f'{n // 1024}K' if n % 1024 == 0 else str(n) for n in lengths]
  errors = [
    f'{m} at {n}: {points[m][n]["error"]}'
    for m in mechanisms
    for n in lengths
    if 'error' in points[m][n]
  ]
  parts = [
    output.header(
      "Long Range Arena efficiency: training steps/s and memory, relative to softmax",
      meta['device_line'],
      meta['notes'],
    ),
    '## Steps per second (relative to softmax; higher is faster)',
    '',
    output.table(heads, [row(m, speed, lambda v: f'{v:.2f}x') for m in mechanisms]),
    '',
    '## Memory (relative to softmax; lower is smaller)',
    '',
    output.table(heads, [row(m, memory, lambda v: f'{v:.2f}x') for m in mechanisms]),
    '',
    '## Absolute',
    '',
    output.table(
      ['mechanism', 'length', 'steps/s', 'memory (XLA)'],
      [
        [
          m,
          n,
          output.fmt_num(points[m][n].get('steps_per_s')),
          output.fmt_bytes(points[m][n].get('memory_bytes')),
        ]
        for m in mechanisms
        for n in lengths
      ],
    ),
  ]
  if errors:
    parts += ['', 'Not measured:', ''] + [f'- {e}' for e in errors]
  parts += ['', published_markdown(mechanisms)]
  return '\n'.join(parts) + '\n'


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  argv = list(sys.argv[1:] if argv is None else argv)
  fv = common.parse_flags(define_flags, argv, __doc__)
  mechanisms = common.csv_list(fv.mechanisms) or list(attention_bench.available_mechanisms())
  if 'softmax' not in mechanisms:
    mechanisms = ['softmax'] + mechanisms  # the reference
  lengths = common.csv_list(fv.lengths, int)
  total = machine.total_memory_bytes()
  budget = (
    int(fv.memory_budget_gb * 2**30)
    if fv.memory_budget_gb
    else (int(0.85 * total) if total else None)
  )
  setting = dict(
    size=fv.size, batch_size=fv.batch_size, steps=fv.steps, budget=budget, clock=fv.clock
  )
  partial = os.path.join(fv.out, f'{fv.name}.partial.json')
  kept = read_partial(partial, setting)
  points: Dict[str, Dict[int, Dict[str, Any]]] = {}
  start = time.time()
  todo = len(mechanisms) * len(lengths)
  for i, m in enumerate(mechanisms):
    for j, n in enumerate(lengths):
      point = kept.get(m, {}).get(n)
      if point is None:
        point = measure_point(m, n, fv.size, fv.batch_size, fv.steps, budget, fv.clock)
        kept.setdefault(m, {})[n] = point
        output.write_json(partial, dict(setting=setting, points=kept))
      points.setdefault(m, {})[n] = point
      done = i * len(lengths) + j + 1
      if not fv.quiet:
        elapsed = time.time() - start
        print(
          f'[lra_efficiency] {done}/{todo} {m} @ {n}: '
          f'{points[m][n].get("steps_per_s", points[m][n].get("error"))} '
          f'({elapsed:.0f}s, ETA {elapsed / done * (todo - done):.0f}s)',
          flush=True,
        )
  info = machine.device_info()
  notes = [
    f"LRA's Text model (configs/lra/text.py, size={fv.size}), batch {fv.batch_size}, "
    f'random bytes; {fv.steps} timed train steps after a warm-up step; every '
    'mechanism at its declared defaults.',
    'time: '
    + (
      'elapsed (wall) time.'
      if fv.clock == 'wall'
      else "the process's CPU time (all threads), not inflated by other processes."
    ),
    "memory: XLA's compiled memory analysis of the train step.",
    'command: python -m benchmarks.lra_efficiency ' + ' '.join(argv),
  ]
  causal = [m for m in mechanisms if ea.get_mechanism(m).causal_only]
  if causal:  # the trainer builds a causal-only mechanism causal, whatever the model
    notes.insert(
      1,
      f'{", ".join(causal)}: causal only, so run in their causal form (a token '
      'sees itself and earlier tokens) inside the bidirectional encoder, mean '
      'pooled: the same task and model, a different attention pattern.',
    )
  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
    notes=notes,
    batch_size=fv.batch_size,
    size=fv.size,
    steps=fv.steps,
  )
  series = {m: (lengths, [points[m][n].get('steps_per_s') for n in lengths]) for m in mechanisms}
  png = output.line_plot(
    f'{fv.out}/{fv.name}.png',
    [('training steps/s', series)],
    xlabel='sequence length',
    ylabel='steps/s',
  )
  data = dict(
    meta=meta,
    mechanisms=mechanisms,
    lengths=lengths,
    points=points,
    relative_speed=relative(points, mechanisms, lengths, 'steps_per_s'),
    relative_memory=relative(points, mechanisms, lengths, 'memory_bytes'),
    published=dict(
      source=PUBLISHED_SOURCE,
      lengths=list(LENGTHS),
      models={
        m: dict(name=n, steps_per_s=v, relative_speed=r, memory_gb=g)
        for m, (n, v, r, g) in PUBLISHED.items()
      },
    ),
    plots=[png],
  )
  output.finish(fv.out, fv.name, data, markdown(meta, points, mechanisms, lengths), quiet=fv.quiet)
  if os.path.exists(partial):
    os.remove(partial)
  return data


def read_partial(path: str, setting: Dict[str, Any]) -> Dict[str, Dict[int, Dict[str, Any]]]:
  """The points an interrupted run of the same setting measured ({} if none): a run is
  resumed by running the same command again."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    saved = json.load(f)
  if saved.get('setting') != setting:
    print(
      f'[lra_efficiency] {path} was measured with {saved.get("setting")}, not {setting}: '
      'measuring again',
      flush=True,
    )
    return {}
  points = {
    m: {int(n): p for n, p in by_length.items()} for m, by_length in saved['points'].items()
  }
  print(
    f'[lra_efficiency] resuming: {sum(map(len, points.values()))} points from {path}', flush=True
  )
  return points


if __name__ == '__main__':
  main()

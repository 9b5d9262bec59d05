r"""Is training input-bound? The config's train step on its real batches and on a synthetic one.

    python -m benchmarks.input --config=configs/mnist.py:standard \
        --config.dataset.source=arrays \
        --config.dataset.data_dir=../shared/data/mnist_train.npz \
        --config.dataset.holdout=0.1 --out=docs/results --name=input_mnist

Builds the run's model, optimiser and jitted train step as training does, then
times blocks of --steps steps, alternating: 'real' draws every batch from the
config's input pipeline (decoding, augmentation, transfer, as in training);
'synthetic' feeds one batch of the same shape already on the devices, so it
measures the step alone. Both are compiled and warmed up first. Reports
examples/s of each (medians over --rounds blocks) and real / synthetic: at 1.0
the input pipeline costs nothing. Writes <out>/<name>.json and .md.
"""

import statistics
import sys
import time
from typing import Any, Dict, Optional, Sequence

import jax

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from train import api


def define_flags(fv, argv: Sequence[str] = ()):
  """The flags; `argv` lets `--config.x=y` overrides register (as in main.py)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  config_flags.DEFINE_config_file(
    'config', None, 'experiment config', flag_values=fv, sys_argv=['tool'] + list(argv)
  )
  flags.DEFINE_integer('steps', 50, 'train steps per timed block', flag_values=fv)
  flags.DEFINE_integer('rounds', 3, 'timed blocks of each kind (interleaved)', flag_values=fv)
  common.define_output_flags(fv, out='benchmark_results', name='input')


def measure(config, steps: int, rounds: int) -> Dict[str, Any]:
  """examples/s of the train step on real and on synthetic batches, interleaved."""
  run = api.build(config, (2 * rounds + 2) * steps)
  c = run.config
  state, train_step = run.state, run.train_step
  real = run.train_batches()
  synthetic = next(real)

  def block(next_batch):
    nonlocal state
    start = time.perf_counter()
    for _ in range(steps):
      state, metrics = train_step(state, next_batch())
    jax.block_until_ready((state, metrics))
    return time.perf_counter() - start

  sides = {'real': lambda: next(real), 'synthetic': lambda: synthetic}
  for fn in sides.values():  # compile, fill the prefetch queue, warm caches
    block(fn)
  times = {name: [] for name in sides}
  for _ in range(rounds):
    for name, fn in sides.items():
      times[name].append(block(fn))
  batch = c.dataset.batch_size
  rate = {name: steps * batch / statistics.median(t) for name, t in times.items()}
  return dict(
    dataset=c.dataset.name,
    source=c.dataset.get('source', ''),
    batch_size=batch,
    steps_per_block=steps,
    rounds=rounds,
    real_examples_per_s=rate['real'],
    synthetic_examples_per_s=rate['synthetic'],
    ratio=rate['real'] / rate['synthetic'],
    times_s=times,
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  argv = list(sys.argv[1:] if argv is None else argv)
  fv = common.parse_flags(lambda values: define_flags(values, argv), argv, __doc__)
  if fv.config is None:
    raise SystemExit('Error: --config is required, e.g. --config=configs/mnist.py:standard')
  row = measure(fv.config, fv.steps, fv.rounds)
  info = machine.device_info()
  notes = [
    f"the config's train step, batch {row['batch_size']}; blocks of {fv.steps} steps, "
    f'{fv.rounds} of each kind interleaved after a warm-up block of each; medians.',
    "real: every batch from the config's input pipeline; synthetic: one batch of the "
    'same shape, already on the devices (the step alone).',
    'command: python -m benchmarks.input ' + ' '.join(argv),
  ]
  table = output.table(
    ['dataset', 'real examples/s', 'synthetic examples/s', 'real / synthetic'],
    [
      [
        row['dataset'],
        f"{row['real_examples_per_s']:.0f}",
        f"{row['synthetic_examples_per_s']:.0f}",
        f"{row['ratio']:.3f}",
      ]
    ],
  )
  output.finish_table(
    fv.out,
    fv.name,
    'Input pipeline: real against synthetic batches',
    machine.describe_device(info),
    notes,
    table,
    dict(device=info, row=row, command=notes[-1]),
    quiet=fv.quiet,
  )
  return row


if __name__ == '__main__':
  main()

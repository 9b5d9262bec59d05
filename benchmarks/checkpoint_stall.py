r"""How long does a checkpoint stop training? Orbax's synchronous against asynchronous saving.

    python -m benchmarks.checkpoint_stall --config=configs/mnist.py:standard \
        --config.dataset.source=arrays \
        --config.dataset.data_dir=../shared/data/mnist_train.npz \
        --out=docs/results --name=checkpoint_stall_mnist

Builds the config's model, optimiser state and jitted train step as training
does, then, for each mode, trains --steps_between steps on the config's real
batches and saves a checkpoint (params and optimiser state, with the trainer's
manifest and finiteness check) through `train.api.Checkpointer`, --saves
times, into a fresh temporary workdir (or under --workdir, e.g. a gs:// bucket).
The stall of a save is the time the loop waits in `save()`: the whole write when
synchronous; with asynchronous saving only the copy to host and the manifest,
while Orbax writes in a background thread. Also reports the train steps' rate
between saves, which a background write can slow. The first save of each mode
is left out of the medians (it compiles the finiteness check). The trainer
records each run's median stall in its results.json (`checkpoint_stall_s`),
first save included.
Writes <out>/<name>.json and .md.
"""

import statistics
import sys
import tempfile
import time
from typing import Any, Dict, Optional, Sequence

from etils import epath
import jax

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from train import api

MODES = (('synchronous', False), ('asynchronous', True))


def define_flags(fv, argv: Sequence[str] = ()):
  """The flags; `argv` lets `--config.x=y` overrides register (as in main.py)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  config_flags.DEFINE_config_file(
    'config', None, 'experiment config', flag_values=fv, sys_argv=['tool'] + list(argv)
  )
  flags.DEFINE_integer('saves', 6, 'checkpoints saved per mode', flag_values=fv)
  flags.DEFINE_integer('steps_between', 20, 'train steps before each save', flag_values=fv)
  flags.DEFINE_string('workdir', '', 'where to write (default: a temporary folder)', flag_values=fv)
  common.define_output_flags(fv, out='benchmark_results', name='checkpoint_stall')


def measure(config, saves: int, steps_between: int, root: str) -> Dict[str, Any]:
  """Per mode: the stall of each save and the examples/s of the steps between saves."""
  run = api.build(config, 2 * saves * steps_between + 1)
  c = run.config
  batches = run.train_batches()
  state, train_step = run.state, run.train_step
  state, metrics = train_step(state, next(batches))  # compile
  jax.block_until_ready((state, metrics))
  rows = {}
  for mode, async_save in MODES:
    ckpt = api.Checkpointer(epath.Path(root) / mode, every=10**9, keep=2, async_save=async_save)
    stalls, rates = [], []
    try:
      for i in range(1, saves + 1):
        start = time.perf_counter()
        for _ in range(steps_between):
          state, metrics = train_step(state, next(batches))
        jax.block_until_ready((state, metrics))
        rates.append(steps_between * c.dataset.batch_size / (time.perf_counter() - start))
        start = time.perf_counter()
        if not ckpt.save(i * steps_between, state.params, state.opt_state, force=True):
          raise SystemExit(
            f'Error: {epath.Path(root) / mode} already holds step '
            f'{i * steps_between}; give --workdir an empty folder'
          )
        stalls.append(time.perf_counter() - start)
      start = time.perf_counter()
    finally:
      ckpt.close()  # waits for the last background write
    rows[mode] = dict(
      stall_s=statistics.median(stalls[1:] or stalls),
      stalls_s=stalls,
      examples_per_s=statistics.median(rates[1:] or rates),
      close_s=time.perf_counter() - start,
    )
  return dict(
    dataset=c.dataset.name,
    batch_size=c.dataset.batch_size,
    params=sum(x.size for x in jax.tree.leaves(state.params)),
    saves=saves,
    steps_between=steps_between,
    modes=rows,
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  argv = list(sys.argv[1:] if argv is None else argv)
  fv = common.parse_flags(lambda values: define_flags(values, argv), argv, __doc__)
  if fv.config is None:
    raise SystemExit('Error: --config is required, e.g. --config=configs/mnist.py:standard')
  with tempfile.TemporaryDirectory() as tmp:
    row = measure(fv.config, fv.saves, fv.steps_between, fv.workdir or tmp)
  info = machine.device_info()
  notes = [
    f"{row['params']:,} parameters and their Adam state; {fv.saves} saves per mode, "
    f'{fv.steps_between} train steps (batch {row["batch_size"]}) before each; medians '
    'leave out the first save.',
    'stall: time the loop waits in save(); close: the wait for the last write at the '
    'end of the run.',
    'command: python -m benchmarks.checkpoint_stall ' + ' '.join(argv),
  ]
  table = output.table(
    ['mode', 'stall per save (ms)', 'train examples/s between saves', 'close (ms)'],
    [
      [mode, f"{r['stall_s'] * 1e3:.1f}", f"{r['examples_per_s']:.0f}", f"{r['close_s'] * 1e3:.1f}"]
      for mode, r in row['modes'].items()
    ],
  )
  output.finish_table(
    fv.out,
    fv.name,
    'Checkpoint stall: synchronous against asynchronous',
    machine.describe_device(info),
    notes,
    table,
    dict(device=info, row=row, command=notes[-1]),
    quiet=fv.quiet,
  )
  return row


if __name__ == '__main__':
  main()

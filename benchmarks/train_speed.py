r"""Training speed of whole experiment configs, measured side by side.

    python -m benchmarks.train_speed --config=configs/mnist.py:standard \
        --config=configs/mnist.py:efficient --examples_per_epoch=54000 \
        --out=docs/results --name=train_speed_mnist

Separate training runs are a poor speed comparison on a shared machine: each
meets a different load. This tool builds each config's model, optimiser and
jitted train step (the trainer's own, `train.api.build`) in one
process, feeds each one synthetic batch of the config's global batch size and
input shape (normal floats for images, the model's dummy tokens for text; only
the speed matters), and then times them in interleaved rounds: every round runs
--steps steps of each config, in an order rotated each round, so that drift in
the machine's load falls on every config alike. Reported per config: the median
over rounds of the time per step, the fastest and slowest round, examples/s,
seconds per epoch (with --examples_per_epoch) and the speed relative to the
first config. Writes <out>/<name>.json, .md and <name>.png (time per step in
each round).
"""

import statistics
import sys
import time
from typing import Any, Dict, Optional, Sequence

import jax
import numpy as np

from benchmarks import common
from benchmarks import machine
from benchmarks import output


def define_flags(fv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_multi_string(
    'config',
    [],
    "config specs, 'path.py' or 'path.py:arg' (the first is the baseline); repeat the flag",
    flag_values=fv,
  )
  flags.DEFINE_integer('batch_size', None, "global batch (default: each config's)", flag_values=fv)
  flags.DEFINE_integer('rounds', 5, 'interleaved timing rounds', flag_values=fv)
  flags.DEFINE_integer('steps', 10, 'timed train steps per config per round', flag_values=fv)
  flags.DEFINE_integer(
    'examples_per_epoch', None, 'training examples per epoch, for seconds per epoch', flag_values=fv
  )
  common.define_output_flags(fv, out='benchmark_results', name='train_speed')


def load_config(spec: str):
  """'configs/mnist.py:super' -> that file's get_config('super') (get_config() without ':')."""
  from train import api  # pylint: disable=g-import-not-at-top

  path, _, arg = spec.partition(':')
  try:
    get_config = api.config_function(path)
  except ValueError as e:
    raise ValueError(f'--config={spec!r}: {e}') from None
  return get_config(arg) if arg else get_config()


SEQUENCE_TASKS = ('sequence_labelling', 'byte_lm')  # labels: (position, token) pairs


def synthetic_batch(config, batch_size: int, seed: int = 0) -> Dict[str, np.ndarray]:
  """{'inputs', 'label', 'mask'} of `config`'s input shape: normal floats for float inputs,
  the model's dummy tokens for integer ones, label 0, every example real. For the sequence
  tasks the label is `[batch, k, 2]` (position, token 0) pairs as `data.sequences.scored`
  gives them: k = the dataset's `num_kv_pairs` (MQAR's queries) or every position."""
  from train import api  # pylint: disable=g-import-not-at-top

  dummy = np.asarray(api.dummy_inputs(config, batch_size))
  if np.issubdtype(dummy.dtype, np.floating):
    dummy = np.random.default_rng(seed).standard_normal(dummy.shape).astype(dummy.dtype)
  label = np.zeros((batch_size,), np.int32)
  if config.get('task') in SEQUENCE_TASKS:
    length = dummy.shape[1]
    k = min(config.dataset.get('num_kv_pairs', None) or length, length)
    positions = np.broadcast_to(np.arange(length - k, length, dtype=np.int32), (batch_size, k))
    label = np.stack([positions, np.zeros_like(positions)], axis=-1)
  return dict(inputs=dummy, label=label, mask=np.ones((batch_size,), np.float32))


def compiled_train_step(config, batch: Dict[str, np.ndarray], num_steps: int = 1000):
  """(compiled train step, initial state, global batch, parameter count) of `config`, on
  the first device: the trainer's model, optimiser and step.

  Raises `train.api.ConfigError` / ValueError for a config the trainer refuses.
  """
  from train import api  # pylint: disable=g-import-not-at-top

  run = api.build(config, num_steps, devices=jax.devices()[:1], read_data=False, seed=0)
  state, batch = run.state, run.to_devices(batch)
  return run.train_step.lower(state, batch).compile(), state, batch, run.num_params


def measure(
  specs: Sequence[str], *, batch_size: Optional[int], rounds: int, steps: int, log=print
) -> Dict[str, Dict[str, Any]]:
  """{spec: {params, batch_size, round_step_s: [seconds per step in each round]}}."""
  built = {}
  for spec in specs:
    config = load_config(spec)
    if batch_size is not None:
      config.dataset.batch_size = batch_size
    b = config.dataset.batch_size
    compiled, state, batch, params = compiled_train_step(config, synthetic_batch(config, b))
    state, metrics = compiled(state, batch)  # warm-up
    jax.block_until_ready((state, metrics))
    built[spec] = dict(
      compiled=compiled, state=state, batch=batch, params=params, batch_size=b, times=[]
    )
    log(f'[train_speed] compiled {spec}: {params:,} parameters, batch {b}')
  start = time.time()
  for r in range(rounds):
    order = list(specs[r % len(specs) :]) + list(specs[: r % len(specs)])
    for spec in order:
      item = built[spec]
      t0 = time.perf_counter()
      state = item['state']
      for _ in range(steps):
        state, metrics = item['compiled'](state, item['batch'])
      jax.block_until_ready((state, metrics))
      item['state'] = state
      item['times'].append((time.perf_counter() - t0) / steps)
    elapsed = time.time() - start
    log(
      f'[train_speed] round {r + 1}/{rounds} ({elapsed:.0f}s, '
      f'ETA {elapsed / (r + 1) * (rounds - r - 1):.0f}s): '
      + ', '.join(f'{s} {built[s]["times"][-1] * 1e3:.1f} ms' for s in specs)
    )
  return {
    s: dict(params=v['params'], batch_size=v['batch_size'], round_step_s=v['times'])
    for s, v in built.items()
  }


def summarise(
  points: Dict[str, Dict[str, Any]], specs: Sequence[str], examples_per_epoch: Optional[int]
) -> Dict[str, Dict[str, Any]]:
  """Adds step_s (median over rounds), min/max, examples/s, s/epoch, relative speed."""
  base = statistics.median(points[specs[0]]['round_step_s'])
  for spec in specs:
    p = points[spec]
    step_s = statistics.median(p['round_step_s'])
    p.update(
      step_s=step_s,
      fastest_round_s=min(p['round_step_s']),
      slowest_round_s=max(p['round_step_s']),
      examples_per_s=p['batch_size'] / step_s,
      relative_speed=base / step_s,
      epoch_s=(
        examples_per_epoch / (p['batch_size'] / step_s) if examples_per_epoch is not None else None
      ),
    )
  return points


def markdown(meta, points, specs) -> str:
  rows = [
    [
      s,
      f'{points[s]["params"]:,}',
      points[s]['batch_size'],
      f'{points[s]["step_s"] * 1e3:.1f}',
      f'{points[s]["fastest_round_s"] * 1e3:.1f}-{points[s]["slowest_round_s"] * 1e3:.1f}',
      f'{points[s]["examples_per_s"]:.0f}',
      '-' if points[s]['epoch_s'] is None else output.fmt_num(points[s]['epoch_s']),
      f'{points[s]["relative_speed"]:.3f}x',
    ]
    for s in specs
  ]
  return (
    '\n'.join(
      [
        output.header('Training speed, configs side by side', meta['device_line'], meta['notes']),
        output.table(
          [
            'config',
            'parameters',
            'batch',
            'ms/step (median)',
            'rounds (ms)',
            'examples/s',
            's/epoch',
            f'speed vs {specs[0]}',
          ],
          rows,
        ),
      ]
    )
    + '\n'
  )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  argv = list(sys.argv[1:] if argv is None else argv)
  fv = common.parse_flags(define_flags, argv, __doc__)
  specs = list(fv.config)
  if not specs:
    sys.exit('Error: give at least one --config=path.py[:arg]')
  if len(set(specs)) != len(specs):
    sys.exit(f'Error: a --config is given twice: {specs}')
  for name in ('rounds', 'steps', 'batch_size', 'examples_per_epoch'):
    value = getattr(fv, name)
    if value is not None and value < 1:  # batch_size, examples_per_epoch: None is unset
      sys.exit(f'Error: --{name}={value} must be at least 1')
  log = (lambda *_: None) if fv.quiet else (lambda m: print(m, flush=True))
  try:
    points = measure(specs, batch_size=fv.batch_size, rounds=fv.rounds, steps=fv.steps, log=log)
  except ValueError as e:  # includes api.ConfigError
    sys.exit(f'Error: {str(e).splitlines()[0]}')
  summarise(points, specs, fv.examples_per_epoch)
  info = machine.device_info()
  notes = [
    f'{fv.rounds} interleaved rounds of {fv.steps} train steps per config, order '
    'rotated each round, after one warm-up step; synthetic inputs; ms/step is the '
    'median over rounds.',
    'command: python -m benchmarks.train_speed ' + ' '.join(argv),
  ]
  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
    notes=notes,
    rounds=fv.rounds,
    steps=fv.steps,
    examples_per_epoch=fv.examples_per_epoch,
  )
  series = {
    s: (list(range(1, fv.rounds + 1)), [t * 1e3 for t in points[s]['round_step_s']]) for s in specs
  }
  png = output.line_plot(
    f'{fv.out}/{fv.name}.png',
    [('time per train step', series)],
    xlabel='round',
    ylabel='ms per step',
    logx=False,
    logy=False,
    integer_x=True,
  )
  data = dict(meta=meta, configs=specs, points=points, plots=[png])
  output.finish(fv.out, fv.name, data, markdown(meta, points, specs), quiet=fv.quiet)
  return data


if __name__ == '__main__':
  main()

"""The training loop and evaluation; what `main.py` calls.

    results = trainer.train_and_evaluate(config, workdir)   # None if stopped by SIGTERM
    metrics = trainer.evaluate(config, workdir)             # newest checkpoint

Workdir: `config.json` (the run's identity, see `train/workdir.py`),
`checkpoints/<step>/` (Orbax, the last `train.keep_checkpoints`),
`tensorboard/` (events), `metrics.jsonl` (one object per log or eval: step,
split and the metric values) and, once the run has finished, `results.json`
and the task's outputs (pixel_lm: `samples.png`, `samples_completion.png`).

Robustness: re-running the same command resumes from the newest sound
checkpoint (the data order and rngs are functions of the step, so the resumed
run matches an uninterrupted one); SIGTERM saves a checkpoint at the current
step and returns; a non-finite loss stops the run with FloatingPointError
naming the step, and no checkpoint is written from non-finite parameters.
Only process 0 writes files other than checkpoints.
"""

import collections
import contextlib
import time
from typing import Any, Dict, Optional

from absl import logging
import jax
import numpy as np

import data
from efficient_attn import registry
from efficient_attn.layers import hybrid
from train import adapters
from train import checkpoint
from train import mesh as mesh_lib
from train import metrics as metrics_lib
from train import modeling
from train import optim
from train import preemption
from train import sharding
from train import steps as steps_lib
from train import tasks
from train import validate
from train import workdir as workdir_lib


class Session:
  """What one training or evaluation run needs, built from the config resolved once.

  `config` (the resolved copy a run records), `dataset` (what the data pipeline is
  handed), `loop` (the training loop's settings), `task`, `model` (built with the
  mechanism's resolved declaration), `inputs` (example inputs, for initialising) and
  `mesh` (`train/mesh.py`: `config.train.mesh` over `devices`, default all, unless a
  `mesh` is given). `read_data=False` skips the data's checks and facts
  (`validate.resolve`), for a model fed synthetic batches; `training=False` skips those
  of the training split alone (evaluation reads only the eval split). A mesh the devices,
  the batch sizes or the sequence cannot take is a ConfigError here, before any work.
  """

  def __init__(
    self, config, mesh=None, read_data: bool = True, training: bool = True, devices=None
  ):
    r = validate.resolve(config, read_data, training)  # every check, before any work
    self.config, self.dataset, self.loop = r.config, r.dataset, r.loop
    self.fsdp_min_size = r.loop.fsdp_min_size
    try:
      self.mesh = mesh_lib.create(r.loop.mesh, devices) if mesh is None else mesh
      mesh_lib.check_batch(self.mesh, self.config.dataset.batch_size)
      mesh_lib.check_batch(self.mesh, self.config.dataset.eval_batch_size, 'eval_batch_size')
      self.data_processes = mesh_lib.data_processes(self.mesh)
    except ValueError as e:
      raise validate.ConfigError(str(e)) from None
    self.task = tasks.get_task(self.config.task)
    self.model = modeling.create_model(self.config, self.dataset, r.mechanism)
    self.inputs = modeling.dummy_inputs(self.config, dataset=self.dataset)
    if mesh_lib.size(self.mesh, mesh_lib.SEQUENCE_AXIS) > 1:
      self._check_sequence(r.mechanism)

  def _check_sequence(self, mechanism) -> None:
    """ConfigError unless the model can split its sequence over the mesh's 'sequence' axis:
    a length it divides, a mechanism with a sequence-parallel form, and whatever else the
    library refuses when the model is traced on the mesh."""
    n = mesh_lib.size(self.mesh, mesh_lib.SEQUENCE_AXIS)
    length = modeling.sequence_length(self.config, self.dataset)[0]
    try:
      if not length:
        raise ValueError(
          f"config.train.mesh['sequence']={n} needs a model with a sequence; "
          f'config.model.kind={self.config.model.kind!r} has none; valid: '
          f"config.train.mesh['sequence']=1"
        )
      mesh_lib.check_length(
        self.mesh,
        length,
        f'config.model.kind={self.config.model.kind!r} on {self.config.dataset.name!r}',
      )
      whole = [d for d in hybrid.declarations(mechanism) if not d.sequence_parallel]
      if whole:
        valid = registry.names_where(lambda m: bool(m.sequence_parallel))
        raise ValueError(
          f"config.train.mesh['sequence']={n} splits the sequence, but "
          f'mechanism {whole[0].name!r} cannot: {whole[0].whole_sequence}; '
          f"valid choices: {', '.join(valid)}; or config.train.mesh"
          f"['sequence']=1"
        )
      rate = self.config.model.attention_dropout_rate
      if rate > 0:  # the library refuses it in training only: here, before any work
        raise ValueError(
          f'config.model.attention_dropout_rate={rate} with config.train.mesh'
          f"['sequence']={n}: attention-weight dropout is not split over "
          f'devices; valid: attention_dropout_rate=0, or config.train.mesh'
          f"['sequence']=1"
        )
      self.abstract_params()  # the library's own refusals, raised when it is traced
    except ValueError as e:
      raise validate.ConfigError(str(e).strip().splitlines()[0]) from None

  def abstract_params(self):
    return steps_lib.abstract_params(self.model, self.inputs, self.mesh, self.fsdp_min_size)

  def train_data(self):
    """This process's training stream: its slice of each global batch (`data_processes`)."""
    index, count = self.data_processes
    return data.get_train_data(self.dataset, process_index=index, process_count=count)

  def eval_data(self):
    """This process's evaluation batches of the eval split."""
    index, count = self.data_processes
    return data.get_eval_data(self.dataset, process_index=index, process_count=count)

  def evaluate(self, params, eval_data) -> Dict[str, float]:
    """Mean metrics of `params` over every example of `eval_data`."""
    eval_step = steps_lib.make_eval_step(self.task, self.model, self.mesh, self.fsdp_min_size)
    total = None
    for batch in sharding.prefetch(eval_data.batches(), self.mesh):
      sums = eval_step(params, batch)
      total = sums if total is None else jax.tree.map(lambda a, b: a + b, total, sums)
    return metrics_lib.reduce_sums(jax.device_get(total))

  def write_outputs(self, params, workdir) -> Dict[str, str]:
    """The task's extra files (pixel_lm: sample PNGs), on the writing process (every
    process gathers the parameters first: FSDP may have split them across processes)."""
    if self.task.write_outputs is None:
      return {}
    if jax.process_count() > 1:
      params = mesh_lib.gathered(params)
    if not sharding.is_writer():
      return {}
    with jax.set_mesh(self.mesh):
      return self.task.write_outputs(self.config, self.model, params, str(workdir))


def _check_finite(step: int, values: Dict[str, float]) -> None:
  if not np.isfinite(values['loss']):
    raise FloatingPointError(
      f'non-finite training loss ({values["loss"]}) at step {step}; stopping. No '
      f'checkpoint is written from this state; the newest checkpoint is from an earlier step.'
    )


def train_and_evaluate(config, workdir: str, restart: bool = False) -> Optional[Dict[str, Any]]:
  """Trains `config` in `workdir` (resuming its newest checkpoint), then evaluates.

  Returns the results (also in results.json), or None when SIGTERM stopped the
  run after saving a checkpoint. `restart`: move a run of another config aside.
  A finished run asked for more steps continues from its final checkpoint.
  """
  wall_start = time.time()
  s = Session(config)
  train_data = s.train_data()
  num_steps = workdir_lib.total_steps(s.loop, train_data.steps_per_epoch)
  run = workdir_lib.open_run(
    workdir, s.config, writer=sharding.is_writer(), restart=restart, num_steps=num_steps
  )
  try:
    if run.finished:
      logging.info('%s has finished (results.json); nothing to do', workdir)
      if run.writer:
        print(
          f'{workdir} has finished; nothing to do. '
          + metrics_lib.final_line(
            run.results.get('eval_split', s.config.dataset.eval_split),
            {
              k[5:]: v
              for k, v in run.results.items()
              if k.startswith('eval_') and isinstance(v, (int, float))
            },
            run.path / workdir_lib.RESULTS,
          ),
          flush=True,
        )
      return run.results
    return _train(s, run, train_data, num_steps, wall_start)
  finally:
    run.close()


def _train(
  s: Session, run, train_data, num_steps: int, wall_start: float
) -> Optional[Dict[str, Any]]:
  c, t = s.config, s.loop
  tx, lr, warmup = optim.create(c, num_steps)
  ckpt = checkpoint.Checkpointer(
    run.path, every=t.checkpoint_every, keep=t.keep_checkpoints, async_save=t.async_checkpoints
  )
  state = _restore_or_init(s, tx, ckpt)
  start = int(jax.device_get(state.step))
  _log_start(s, state, num_steps, train_data, warmup)
  logging.info(
    'mesh: %s (%s)',
    mesh_lib.describe(s.mesh),
    'parameters and optimiser state sharded over fsdp'
    if mesh_lib.size(s.mesh, 'fsdp') > 1
    else 'parameters replicated',
  )
  writer = metrics_lib.create_writer(run.path, enabled=run.writer, resume_step=start)
  from clu import periodic_actions  # pylint: disable=g-import-not-at-top  (TensorFlow)

  report = periodic_actions.ReportProgress(
    num_train_steps=num_steps, writer=writer, every_steps=t.log_every
  )
  train_step = steps_lib.make_train_step(
    s.task, s.model, tx, jax.random.key(t.seed), s.mesh, s.fsdp_min_size
  )
  batches = sharding.prefetch(train_data.batches(start), s.mesh)
  clock = _Clock(train_data.steps_per_epoch)
  window, recent, eval_values = [], collections.deque(maxlen=train_data.steps_per_epoch), {}
  stalls = []  # seconds the loop waited in each checkpoint save
  # One process: SIGTERM sets a flag. Several: JAX's preemption service (Orbax's sync point).
  with preemption.StopOnSignal(enabled=jax.process_count() == 1) as stop, ckpt.finishing():
    for step in range(start + 1, num_steps + 1):
      state, step_metrics = train_step(state, next(batches))
      window.append(step_metrics)
      logs = step % t.log_every == 0 or step == num_steps
      if logs:
        rows = jax.device_get(window)
        window.clear()
        values = metrics_lib.reduce_sums(metrics_lib.sum_rows(rows))
        _check_finite(step, values)
        recent.extend(rows)
        with clock.paused():  # not training: the first call compiles the schedule's ops
          values['learning_rate'] = float(lr(step - 1))
          writer.write_scalars(step, {f'train/{k}': v for k, v in values.items()})
        ckpt.check()
      report(step)
      if step == start + 1:  # the steady rate starts once the first step has run, not when
        jax.block_until_ready(state)  # its compiled program was dispatched
      clock.tick(step)
      if logs:
        rate = clock.steady_steps_per_sec()
        if rate:  # the printed 'ex/s', in the metrics too (a running run's report)
          with clock.paused():
            writer.write_scalars(
              step, {'progress/steady_examples_per_sec': rate * c.dataset.batch_size}
            )
        if run.writer:
          print(
            metrics_lib.progress_line(step, num_steps, values, rate, c.dataset.batch_size),
            flush=True,
          )
      # Saved before evaluating: an evaluation that fails (a bad eval split, a crash)
      # never costs the steps trained since the last checkpoint; the re-run resumes here.
      with report.timed('checkpoint'), clock.paused():
        t0 = time.monotonic()
        if ckpt.save(step, state.params, state.opt_state, force=step == num_steps):
          stalls.append(time.monotonic() - t0)
      if (t.eval_every > 0 and step % t.eval_every == 0) or step == num_steps:
        with report.timed('eval'), clock.paused():
          eval_values = s.evaluate(state.params, s.eval_data())
        writer.write_scalars(step, {f'eval/{k}': v for k, v in eval_values.items()})
        if run.writer:
          print(f'eval {step}/{num_steps} | {metrics_lib.format_values(eval_values)}', flush=True)
      if step < num_steps and (stop.requested or ckpt.reached_preemption(step)):
        ckpt.save(step, state.params, state.opt_state, force=True)
        ckpt.close()
        logging.warning(
          'Stopped by %s at step %d/%d: checkpoint saved in %s; re-run the same command to resume.',
          stop.signal_name or 'preemption',
          step,
          num_steps,
          ckpt.directory,
        )
        return None
  if not eval_values:  # resumed at the end: evaluate the final state
    eval_values = s.evaluate(state.params, s.eval_data())
  ckpt.close()
  writer.close()
  outputs = s.write_outputs(state.params, run.path)
  results = _results(
    s,
    state,
    num_steps,
    start,
    recent,
    eval_values,
    clock,
    wall_start,
    train_data.steps_per_epoch,
    outputs,
  )
  results.update(
    checkpoints_saved=len(stalls), checkpoint_stall_s=float(np.median(stalls)) if stalls else None
  )
  if run.writer:
    workdir_lib.write_json(run.path, workdir_lib.RESULTS, results)
  _say(metrics_lib.final_line(c.dataset.eval_split, eval_values, run.path / workdir_lib.RESULTS))
  if outputs:
    _say(metrics_lib.outputs_line(outputs))
  return results


class _Clock:
  """Measured epoch times: wall time between epoch boundaries, eval and saving excluded;
  and the steady step rate: every step after the first (which compiles), the same excluded.

  Excluded ('paused'): evaluation, checkpoint saving and writing the logged metrics (whose
  first call compiles the learning-rate schedule's ops, ~1.5 s on a CPU). The steady rate
  times batch size is the 'ex/s' of every progress line and results.json's
  `steady_examples_per_sec`; the median epoch time gives its `examples_per_sec`."""

  def __init__(self, steps_per_epoch: int):
    self.steps_per_epoch = steps_per_epoch
    self.epochs = []  # seconds of each whole epoch run here (the first compiles)
    self._start, self._excluded, self._steps = time.monotonic(), 0.0, 0
    self._first = None  # time of the first tick, and pauses since then
    self._paused_total, self._steady = 0.0, (0, 0.0)  # (steps, seconds) at the last tick

  def tick(self, step: int) -> None:
    now = time.monotonic()
    if self._first is None:
      self._first, self._paused_total = now, 0.0
    else:
      self._steady = (self._steady[0] + 1, now - self._first - self._paused_total)
    self._steps += 1
    if step % self.steps_per_epoch == 0:
      if self._steps == self.steps_per_epoch:
        self.epochs.append(now - self._start - self._excluded)
      self._start, self._excluded, self._steps = now, 0.0, 0

  @contextlib.contextmanager
  def paused(self):
    t0 = time.monotonic()
    yield
    paused = time.monotonic() - t0
    self._excluded += paused
    self._paused_total += paused

  def steady_steps_per_sec(self) -> Optional[float]:
    """Steps per second over every step after the first (from the end of the first step to
    the last tick), the paused time excluded (None: one step)."""
    steps, seconds = self._steady
    return steps / seconds if steps and seconds > 0 else None

  def epoch_time(self) -> Optional[float]:
    """Median measured epoch time, leaving out the first (compiling) epoch when possible."""
    times = self.epochs[1:] or self.epochs
    return float(np.median(times)) if times else None


def _restore_or_init(s: Session, tx, ckpt):
  """The newest sound checkpoint's state, else a fresh one (from init_from if set)."""
  abstract = steps_lib.abstract_state(s.model, tx, s.inputs, s.mesh, s.fsdp_min_size)
  try:
    restored = ckpt.restore(abstract.params, abstract.opt_state)
  except checkpoint.CheckpointMismatch as e:
    raise workdir_lib.WorkdirError(str(e)) from None
  if restored is not None:
    step, params, opt_state = restored
    _say(f'Resumed from the checkpoint at step {step} of {ckpt.directory}')
    return steps_lib.TrainState(
      jax.device_put(np.int32(step), sharding.replicated(s.mesh)), params, opt_state
    )
  key = jax.random.key(s.loop.seed)
  params = None
  if s.config.get('init_from'):
    with jax.set_mesh(s.mesh):
      fresh = jax.jit(lambda k: steps_lib.init_params(s.model, s.inputs, k))(key)
    step, loaded = checkpoint.restore_params(s.config.init_from, s.mesh)
    params, report = adapters.init_from(s.config, fresh, loaded)
    logging.info(
      'init_from %s (step %d): %d arrays copied, %d kept fresh (%s), %d unused',
      s.config.init_from,
      step,
      len(report['copied']),
      len(report['fresh']),
      ', '.join(report['fresh'][:8]),
      len(report['unused']),
    )
  return steps_lib.create_train_state(s.model, tx, s.inputs, s.mesh, key, params, s.fsdp_min_size)


def _say(message: str) -> None:
  """A line for the user: in the log, and on stdout on the writing process."""
  logging.info('%s', message)
  if sharding.is_writer():
    print(message, flush=True)


def _log_start(s: Session, state, num_steps: int, train_data, warmup: int) -> None:
  c = s.config
  total, attention = modeling.parameter_counts(state.params)
  _say(
    f'{c.model.kind}: {c.attention.projection} x {c.attention.mechanism} attention, '
    f'{total:,} parameters ({attention:,} per attention layer); {jax.device_count()} '
    f'devices, {jax.process_count()} processes; {num_steps} steps of '
    f'{c.dataset.batch_size} examples ({train_data.steps_per_epoch} steps per epoch)'
  )
  if warmup < c.optim.warmup_steps:  # by design in a short run (optim.warmup_steps): info
    logging.info(
      'optim.warmup_steps=%d is capped at %d (optim.max_warmup_fraction=%s of %d steps)',
      c.optim.warmup_steps,
      warmup,
      c.optim.max_warmup_fraction,
      num_steps,
    )


def _results(
  s: Session,
  state,
  num_steps,
  start,
  recent,
  eval_values,
  clock,
  wall_start,
  steps_per_epoch,
  outputs,
) -> Dict[str, Any]:
  c = s.config
  total, attention = modeling.parameter_counts(state.params)
  train_values = metrics_lib.reduce_sums(metrics_lib.sum_rows(recent)) if recent else {}
  epoch_time = clock.epoch_time()
  steady = clock.steady_steps_per_sec()
  steady = steady * c.dataset.batch_size if steady else None
  return {
    **{f'train_{k}': v for k, v in train_values.items()},
    **{f'eval_{k}': v for k, v in eval_values.items()},
    'params_total': total,
    'params_trainable': adapters.trainable_count(c, state.params),
    'params_per_attention_layer': attention,
    'epoch_time_s': epoch_time,
    'epochs_timed': len(clock.epochs),
    # Examples per epoch / the median whole epoch's time (the first, compiling, epoch left
    # out when there are two or more); in a run shorter than one epoch, the steady rate.
    'examples_per_sec': (
      steps_per_epoch * c.dataset.batch_size / epoch_time if epoch_time else steady
    ),
    # The 'ex/s' the trainer prints, its last value: every step after the first.
    'steady_examples_per_sec': steady,
    'steps': num_steps,
    'steps_per_epoch': steps_per_epoch,
    'resumed_from_step': start,
    'wall_time_s': time.time() - wall_start,
    'dataset': c.dataset.name,
    'eval_split': c.dataset.eval_split,
    'task': c.task,
    'model': c.model.kind,
    'mechanism': c.attention.mechanism,
    'projection': c.attention.projection,
    'heads': c.model.num_heads,
    'd_model': c.model.d_model,
    'depth': c.model.depth,
    'devices': jax.device_count(),
    'mesh': {name: mesh_lib.size(s.mesh, name) for name in s.mesh.axis_names},
    'device': jax.devices()[0].device_kind,  # 'cpu', 'NVIDIA H100 80GB HBM3', 'TPU v4'
    **({'outputs': outputs} if outputs else {}),
  }


def evaluate(config, workdir: str) -> Dict[str, float]:
  """Evaluates the newest sound checkpoint of `workdir` on `dataset.eval_split`.

  The run's stored config must match `config` (the eval split, batch size and
  data location may differ). Prints the metrics and writes them, with the
  step, to `eval_results.json`.
  """
  folder = checkpoint.checkpoint_dir(workdir)
  if not folder.is_dir():  # before the data is opened (a TFDS download, say)
    raise FileNotFoundError(
      f'no checkpoints directory {folder}; --mode=eval reads a trained '
      f'run: train it first, or name its --workdir'
    )
  s = Session(config, training=False)
  workdir_lib.check_identity(workdir, s.config, evaluating=True)
  try:
    step, params = checkpoint.restore_params(workdir, s.mesh, s.abstract_params())
  except checkpoint.CheckpointMismatch as e:
    raise workdir_lib.WorkdirError(str(e)) from None
  values = s.evaluate(params, s.eval_data())
  logging.info(
    'eval at step %d on %s: %s',
    step,
    s.config.dataset.eval_split,
    ', '.join(f'{k} {v:.4g}' for k, v in values.items()),
  )
  print(f'eval {step} | {metrics_lib.format_values(values)}', flush=True)
  if sharding.is_writer():
    outputs = s.write_outputs(params, workdir)
    if outputs:
      print(metrics_lib.outputs_line(outputs), flush=True)
    workdir_lib.write_json(
      workdir, 'eval_results.json', {'step': step, 'split': s.config.dataset.eval_split, **values}
    )
  return values

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
import time
from typing import Any, Dict, Optional

from absl import logging
import jax
import numpy as np

from train import adapters
from train import checkpoint
from train import mesh as mesh_lib
from train import metrics as metrics_lib
from train import modeling
from train import optim
from train import preemption
from train import progress
from train import sharding
from train import steps as steps_lib
from train import timing
from train import workdir as workdir_lib
from train.session import Session


def _tokens_rate(clock: timing.Clock, rows) -> Optional[float]:
  """Real tokens per second at the steady step rate (None: not counted, or one step)."""
  steps, tokens = clock.steady_steps_per_sec(), metrics_lib.tokens_per_step(rows)
  return steps * tokens if steps and tokens is not None else None


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
  session = Session(config)
  train_data = session.train_data()
  num_steps = workdir_lib.total_steps(session.loop, train_data.steps_per_epoch)
  run = workdir_lib.open_run(
    workdir, session.config, writer=sharding.is_writer(), restart=restart, num_steps=num_steps
  )
  try:
    if run.finished:
      _report_finished(session, run, workdir)
      return run.results
    return _train(session, run, train_data, num_steps, wall_start)
  finally:
    run.close()


def _report_finished(session: Session, run, workdir: str) -> None:
  """Says that the run in `workdir` has finished, with its final evaluation."""
  logging.info('%s has finished (results.json); nothing to do', workdir)
  if not run.writer:
    return
  prefix = 'eval_'
  values = {
    name[len(prefix) :]: value
    for name, value in run.results.items()
    if name.startswith(prefix) and isinstance(value, (int, float))
  }
  split = run.results.get('eval_split', session.config.dataset.eval_split)
  print(
    f'{workdir} has finished; nothing to do. '
    + metrics_lib.final_line(split, values, run.path / workdir_lib.RESULTS),
    flush=True,
  )


def _train(
  session: Session, run, train_data, num_steps: int, wall_start: float
) -> Optional[Dict[str, Any]]:
  """Trains from the run's newest checkpoint to `num_steps`, then evaluates and writes the
  results: they, or None when a signal stopped the run (after saving a checkpoint)."""
  settings = session.loop
  tx, learning_rate, warmup = optim.create(session.config, num_steps)
  checkpointer = checkpoint.Checkpointer(
    run.path,
    every=settings.checkpoint_every,
    keep=settings.keep_checkpoints,
    async_save=settings.async_checkpoints,
  )
  state = _restore_or_init(session, tx, checkpointer)
  start = int(jax.device_get(state.step))
  _log_start(session, state, num_steps, train_data, warmup)
  _log_mesh(session.mesh)
  training = _TrainingLoop(
    session, run, train_data, num_steps, start, tx, learning_rate, checkpointer
  )
  state = training.run_steps(state)
  if state is None:
    return None
  return training.finish(state, wall_start)


class _TrainingLoop:
  """The training loop of one run, from step `start` to `num_steps`: each step trains,
  and in turn logs, checkpoints, evaluates and stops when asked (`run_steps`); `finish`
  evaluates what it has not, closes and writes the results.

  It keeps the metric rows since the last log (`window`), the last epoch's (`recent`),
  the newest evaluation (`eval_values`) and the seconds each checkpoint save stalled the
  loop (`stalls`)."""

  def __init__(
    self,
    session: Session,
    run,
    train_data,
    num_steps: int,
    start: int,
    tx,
    learning_rate,
    checkpointer,
  ):
    self.session, self.run, self.num_steps, self.start = session, run, num_steps, start
    self.settings, self.learning_rate, self.checkpointer = session.loop, learning_rate, checkpointer
    self.steps_per_epoch = train_data.steps_per_epoch
    self.writer = metrics_lib.create_writer(run.path, enabled=run.writer, resume_step=start)
    self.report = progress.ReportProgress(
      num_train_steps=num_steps, writer=self.writer, every_steps=self.settings.log_every
    )
    self.train_step = steps_lib.make_train_step(
      session.task,
      session.model,
      tx,
      jax.random.key(self.settings.seed),
      session.mesh,
      session.fsdp_min_size,
    )
    self.batches = sharding.prefetch(train_data.batches(start), session.mesh)
    self.clock = timing.Clock(self.steps_per_epoch)
    self.window, self.recent = [], collections.deque(maxlen=self.steps_per_epoch)
    self.tokens = None  # real tokens per step, for a task that counts them
    self.eval_values, self.stalls = {}, []

  def run_steps(self, state):
    """The state at `num_steps`, or None when a signal (or a preemption) stopped the run
    (a checkpoint saved first). One process: SIGTERM sets a flag; several: JAX's
    preemption service (Orbax's sync point)."""
    enabled = jax.process_count() == 1
    with preemption.StopOnSignal(enabled=enabled) as stop, self.checkpointer.finishing():
      for step in range(self.start + 1, self.num_steps + 1):
        state = self._step(step, state)
        # Saved before evaluating: an evaluation that fails (a bad eval split, a crash)
        # never costs the steps trained since the last checkpoint; the re-run resumes here.
        self._save(step, state)
        self._evaluate_if_due(step, state)
        if step < self.num_steps and (stop.requested or self.checkpointer.reached_preemption(step)):
          self._stop(step, state, stop.signal_name)
          return None
    return state

  def _step(self, step: int, state):
    """One training step, its metrics logged when due, and the clock's tick."""
    state, step_metrics = self.train_step(state, next(self.batches))
    self.window.append(step_metrics)
    logs = step % self.settings.log_every == 0 or step == self.num_steps
    values = self._log_metrics(step) if logs else None
    self.report(step)
    if step == self.start + 1:  # the steady rate starts once the first step has run, not
      jax.block_until_ready(state)  # when its compiled program was dispatched
    self.clock.tick(step)
    if logs:
      self._log_progress(step, values)
    return state

  def _log_metrics(self, step: int) -> Dict[str, float]:
    """The mean metrics of the steps since the last log, written with the learning rate;
    FloatingPointError for a non-finite loss."""
    rows = jax.device_get(self.window)
    self.window.clear()
    values = metrics_lib.reduce_sums(metrics_lib.sum_rows(rows))
    self.tokens = metrics_lib.tokens_per_step(rows)
    _check_finite(step, values)
    self.recent.extend(rows)
    with self.clock.paused():  # not training: the first call compiles the schedule's ops
      values['learning_rate'] = float(self.learning_rate(step - 1))
      self.writer.write_scalars(step, {f'train/{k}': v for k, v in values.items()})
    self.checkpointer.check()
    return values

  def _log_progress(self, step: int, values: Dict[str, float]) -> None:
    """The steady rate in the metrics and the progress line (the printed 'ex/s', in the
    metrics too: a running run's report)."""
    batch_size = self.session.config.dataset.batch_size
    rate = self.clock.steady_steps_per_sec()
    if rate:
      scalars = {'progress/steady_examples_per_sec': rate * batch_size}
      if self.tokens is not None:
        scalars['progress/steady_tokens_per_sec'] = rate * self.tokens
      with self.clock.paused():
        self.writer.write_scalars(step, scalars)
    if self.run.writer:
      line = metrics_lib.progress_line(step, self.num_steps, values, rate, batch_size, self.tokens)
      print(line, flush=True)

  def _save(self, step: int, state) -> None:
    """A checkpoint when one is due (always at the last step), timing the loop's stall."""
    with self.report.timed('checkpoint'), self.clock.paused():
      began = time.monotonic()
      force = step == self.num_steps
      if self.checkpointer.save(step, state.params, state.opt_state, force=force):
        self.stalls.append(time.monotonic() - began)

  def _evaluate_if_due(self, step: int, state) -> None:
    """An evaluation every `eval_every` steps and at the last, written and printed."""
    eval_every = self.settings.eval_every
    if not ((eval_every > 0 and step % eval_every == 0) or step == self.num_steps):
      return
    with self.report.timed('eval'), self.clock.paused():
      self.eval_values = self.session.evaluate(state.params, self.session.eval_data())
    self.writer.write_scalars(step, {f'eval/{k}': v for k, v in self.eval_values.items()})
    if self.run.writer:
      line = metrics_lib.format_values(self.eval_values)
      print(f'eval {step}/{self.num_steps} | {line}', flush=True)

  def _stop(self, step: int, state, signal_name: Optional[str]) -> None:
    """Saves `state` at `step` and closes the checkpointer: a signal stopped the run."""
    self.checkpointer.save(step, state.params, state.opt_state, force=True)
    self.checkpointer.close()
    logging.warning(
      'Stopped by %s at step %d/%d: checkpoint saved in %s; re-run the same command to resume.',
      signal_name or 'preemption',
      step,
      self.num_steps,
      self.checkpointer.directory,
    )

  def finish(self, state, wall_start: float) -> Dict[str, Any]:
    """Evaluates the final state if the loop has not (a run resumed at its end), closes
    the checkpointer and the writer, writes the task's outputs and the results."""
    session, run = self.session, self.run
    if not self.eval_values:  # resumed at the end: evaluate the final state
      self.eval_values = session.evaluate(state.params, session.eval_data())
    self.checkpointer.close()
    self.writer.close()
    outputs = session.write_outputs(state.params, run.path)
    results = self.results(state, outputs, wall_start)
    if run.writer:
      workdir_lib.write_json(run.path, workdir_lib.RESULTS, results)
    split = session.config.dataset.eval_split
    _say(metrics_lib.final_line(split, self.eval_values, run.path / workdir_lib.RESULTS))
    if outputs:
      _say(metrics_lib.outputs_line(outputs))
    return results

  def results(self, state, outputs: Dict[str, str], wall_start: float) -> Dict[str, Any]:
    """What results.json holds: the metrics, the model's size, the speed and the run."""
    session, stalls = self.session, self.stalls
    config = session.config
    total, attention = modeling.parameter_counts(state.params)
    train_values = metrics_lib.reduce_sums(metrics_lib.sum_rows(self.recent)) if self.recent else {}
    batch_size = config.dataset.batch_size
    epoch_time = self.clock.epoch_time()
    steady = self.clock.steady_steps_per_sec()
    steady = steady * batch_size if steady else None
    return {
      **{f'train_{k}': v for k, v in train_values.items()},
      **{f'eval_{k}': v for k, v in self.eval_values.items()},
      'params_total': total,
      'params_trainable': adapters.trainable_count(config, state.params),
      'params_per_attention_layer': attention,
      'epoch_time_s': epoch_time,
      'epochs_timed': len(self.clock.epochs),
      # Examples per epoch / the median whole epoch's time (the first, compiling, epoch left
      # out when there are two or more); in a run shorter than one epoch, the steady rate.
      'examples_per_sec': (
        self.steps_per_epoch * batch_size / epoch_time if epoch_time else steady
      ),
      # The 'ex/s' the trainer prints, its last value: every step after the first.
      'steady_examples_per_sec': steady,
      # Its 'tok/s' (real tokens: a packed row holds more than a padded one), for a task
      # that counts them; the tokens of a step are the last epoch's mean.
      'steady_tokens_per_sec': _tokens_rate(self.clock, self.recent),
      'steps': self.num_steps,
      'steps_per_epoch': self.steps_per_epoch,
      'resumed_from_step': self.start,
      'wall_time_s': time.time() - wall_start,
      'dataset': config.dataset.name,
      'eval_split': config.dataset.eval_split,
      'task': config.task,
      'model': config.model.kind,
      'mechanism': config.attention.mechanism,
      'projection': config.attention.projection,
      'heads': config.model.num_heads,
      'd_model': config.model.d_model,
      'depth': config.model.depth,
      'devices': jax.device_count(),
      'mesh': {name: mesh_lib.size(session.mesh, name) for name in session.mesh.axis_names},
      'device': jax.devices()[0].device_kind,  # 'cpu', 'NVIDIA H100 80GB HBM3', 'TPU v4'
      **({'outputs': outputs} if outputs else {}),
      'checkpoints_saved': len(stalls),
      'checkpoint_stall_s': float(np.median(stalls)) if stalls else None,
    }


def _restore_or_init(session: Session, tx, checkpointer):
  """The newest sound checkpoint's state, else a fresh one (from init_from if set)."""
  abstract = steps_lib.abstract_state(
    session.model, tx, session.inputs, session.mesh, session.fsdp_min_size
  )
  try:
    restored = checkpointer.resume(abstract.params, abstract.opt_state)
  except (checkpoint.CheckpointMismatch, checkpoint.CheckpointDamaged) as e:
    raise workdir_lib.WorkdirError(str(e)) from None
  if restored is not None:
    step, params, opt_state = restored
    _say(f'Resumed from the checkpoint at step {step} of {checkpointer.directory}')
    return steps_lib.TrainState(
      jax.device_put(np.int32(step), sharding.replicated(session.mesh)), params, opt_state
    )
  key = jax.random.key(session.loop.seed)
  params = _init_from(session, key) if session.config.get('init_from') else None
  return steps_lib.create_train_state(
    session.model, tx, session.inputs, session.mesh, key, params, session.fsdp_min_size
  )


def _init_from(session: Session, key):
  """Fresh params from `key` with those of the `config.init_from` run copied in."""
  with jax.set_mesh(session.mesh):
    fresh = jax.jit(lambda k: steps_lib.init_params(session.model, session.inputs, k))(key)
  config = session.config
  step, loaded = checkpoint.restore_params(config.init_from, session.mesh)
  params, report = adapters.init_from(config, fresh, loaded)
  logging.info(
    'init_from %s (step %d): %d arrays copied, %d kept fresh (%s), %d unused',
    config.init_from,
    step,
    len(report['copied']),
    len(report['fresh']),
    ', '.join(report['fresh'][:8]),
    len(report['unused']),
  )
  return params


def _say(message: str) -> None:
  """A line for the user: in the log, and on stdout on the writing process."""
  logging.info('%s', message)
  if sharding.is_writer():
    print(message, flush=True)


def _log_start(session: Session, state, num_steps: int, train_data, warmup: int) -> None:
  """What is trained, on what, and for how long; the warmup's cap."""
  config = session.config
  total, attention = modeling.parameter_counts(state.params)
  _say(
    f'{config.model.kind}: {config.attention.projection} x {config.attention.mechanism} '
    f'attention, {total:,} parameters ({attention:,} per attention layer); '
    f'{jax.device_count()} devices, {jax.process_count()} processes; {num_steps} steps of '
    f'{config.dataset.batch_size} examples ({train_data.steps_per_epoch} steps per epoch)'
  )
  optim_config = config.optim
  if warmup < optim_config.warmup_steps:  # by design in a short run (optim.warmup_steps): info
    logging.info(
      'optim.warmup_steps=%d is capped at %d (optim.max_warmup_fraction=%s of %d steps)',
      optim_config.warmup_steps,
      warmup,
      optim_config.max_warmup_fraction,
      num_steps,
    )


def _log_mesh(mesh) -> None:
  logging.info(
    'mesh: %s (%s)',
    mesh_lib.describe(mesh),
    'parameters and optimiser state sharded over fsdp'
    if mesh_lib.size(mesh, 'fsdp') > 1
    else 'parameters replicated',
  )


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
  session = Session(config, training=False)
  workdir_lib.check_identity(workdir, session.config, evaluating=True)
  try:
    step, params = checkpoint.restore_params(workdir, session.mesh, session.abstract_params())
  except checkpoint.CheckpointMismatch as e:
    raise workdir_lib.WorkdirError(str(e)) from None
  values = session.evaluate(params, session.eval_data())
  logging.info(
    'eval at step %d on %s: %s',
    step,
    session.config.dataset.eval_split,
    ', '.join(f'{k} {v:.4g}' for k, v in values.items()),
  )
  print(f'eval {step} | {metrics_lib.format_values(values)}', flush=True)
  if sharding.is_writer():
    outputs = session.write_outputs(params, workdir)
    if outputs:
      print(metrics_lib.outputs_line(outputs), flush=True)
    workdir_lib.write_json(
      workdir,
      'eval_results.json',
      {'step': step, 'split': session.config.dataset.eval_split, **values},
    )
  return values

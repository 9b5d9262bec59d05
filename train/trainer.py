"""Training and evaluation loops; the functions `main.py` and the tools call.

    results = trainer.train_and_evaluate(config, workdir)   # None if stopped by SIGTERM
    metrics = trainer.evaluate(config, workdir)             # latest checkpoint
    config, model, params = trainer.load_model_and_params(workdir)

Workdir: `config.json` (the config used), `checkpoints/<step>/` (Orbax, last
`train.keep_checkpoints`), `tensorboard/` (events), `metrics.jsonl` (one
object per log or eval: step, split, loss, accuracy, [top5_accuracy],
grad_norm, learning_rate, examples_per_sec, epoch_time_s) and, once the run
has finished, `results.json` and the task's outputs (pixel_lm: `samples.png`,
`samples_completion.png`; also written by `evaluate`).

Robustness: re-running the same command resumes from the newest readable
checkpoint (the data order and rngs are functions of the step, so the resumed
run matches an uninterrupted one); SIGTERM saves a checkpoint at the current
step and returns (exit code 0); a non-finite loss stops the run with
FloatingPointError naming the step, and no checkpoint is written from
non-finite parameters. Only process 0 writes files other than checkpoints.
"""
import collections
import json
import os
import time
from typing import Any, Dict, Optional

from absl import logging
import jax
import ml_collections
import numpy as np

from train import adapters
from train import checkpoint
from train import input_pipeline
from train import metrics as metrics_lib
from train import models
from train import optim
from train import preemption
from train import sharding
from train import steps as steps_lib
from train import tasks
from train import validate


def _resolved(config) -> ml_collections.ConfigDict:
  """A copy of `config` with values read from the data filled in (num_classes)."""
  config = ml_collections.ConfigDict(config.to_dict())
  if config.dataset.num_classes == 0:
    config.dataset.num_classes = input_pipeline.num_classes(config)
  return config


def _prepare(config, mesh=None):
  """Validates (before any work), prepares data; returns (config, task, model, mesh)."""
  validate.validate_config(config)
  try:  # missing data or a batch the devices cannot split: the message names the field
    input_pipeline.prepare(config)
    config = _resolved(config)
    mesh = sharding.create_mesh() if mesh is None else mesh
    sharding.check_batch_size(config.dataset.batch_size, mesh)
    sharding.check_batch_size(config.dataset.eval_batch_size, mesh, 'eval_batch_size')
  except ValueError as e:
    raise validate.ConfigError(str(e)) from None
  task = tasks.get_task(config.task)
  return config, task, task.create_model(config), mesh


def _write_json(path: str, obj) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def run_eval(eval_step, params, eval_data, mesh) -> Dict[str, float]:
  """Mean metrics of `params` over every example of `eval_data`."""
  total = None
  for batch in sharding.prefetch(eval_data.batches(), mesh):
    sums = eval_step(params, batch)
    total = sums if total is None else jax.tree.map(lambda a, b: a + b, total, sums)
  return metrics_lib.reduce_sums(jax.device_get(total))


class _Throughput:
  """Examples/s over log windows, excluding eval and checkpoint time.

  The first window of a process holds compilation and is left out of the
  steady-state rate reported in results.json (unless it is the only one).
  """

  def __init__(self, global_batch: int):
    self.global_batch = global_batch
    self.start = time.time()
    self.steps = 0
    self.excluded = 0.0
    self.windows = 0
    self.steady_steps, self.steady_time = 0, 0.0
    self.last_rate = 0.0

  def exclude(self, seconds: float) -> None:
    self.excluded += seconds

  def end_window(self) -> float:
    """Closes the current window; returns its examples/s."""
    elapsed = max(time.time() - self.start - self.excluded, 1e-9)
    self.last_rate = self.steps * self.global_batch / elapsed
    if self.windows > 0:
      self.steady_steps += self.steps
      self.steady_time += elapsed
    self.windows += 1
    self.start, self.steps, self.excluded = time.time(), 0, 0.0
    return self.last_rate

  def rate(self) -> float:
    if self.steady_time > 0:
      return self.steady_steps * self.global_batch / self.steady_time
    return self.last_rate


def _check_finite(host_metrics) -> None:
  for step, m in host_metrics:
    loss = float(m['loss']) / max(float(m['count']), 1.0)
    if not np.isfinite(loss):
      raise FloatingPointError(
          f'non-finite training loss ({loss}) at step {step}; stopping. No checkpoint is '
          f'written from this state; the newest checkpoint is from an earlier step.')


def train_and_evaluate(config, workdir: str) -> Optional[Dict[str, Any]]:
  """Trains `config` in `workdir` (resuming if it holds checkpoints), evaluates.

  Returns the results dict (also written to results.json), or None when
  SIGTERM stopped the run after saving a checkpoint.
  """
  wall_start = time.time()
  config, task, model, mesh = _prepare(config)
  is_writer = sharding.is_writer()
  workdir = os.path.abspath(workdir)
  if os.path.exists(os.path.join(workdir, 'results.json')):
    logging.info('%s/results.json exists: the run has finished; nothing to do', workdir)
    with open(os.path.join(workdir, 'results.json')) as f:
      return json.load(f)
  if is_writer:
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True))

  train_data = input_pipeline.get_train_data(config)
  eval_data = input_pipeline.get_eval_data(config)
  t = config.train
  num_steps = t.num_steps if t.num_steps > 0 else t.num_epochs * train_data.steps_per_epoch
  tx = optim.create_optimizer(config, num_steps, task.trainable_fn(config))
  lr_fn = optim.learning_rate_schedule(config, num_steps)
  init_key, base_key = jax.random.split(jax.random.key(t.seed))

  ckpt = checkpoint.Checkpointer(workdir, keep=t.keep_checkpoints)
  state = _restore_or_create_state(config, task, model, tx, mesh, ckpt, init_key)
  start_step = int(jax.device_get(state.step))

  params_total, params_attention = models.parameter_counts(state.params)
  params_trainable = models.count_trainable(state.params, task.trainable_fn(config))
  logging.info('%s: %s x %s attention, %s parameters (%s per attention layer); %d devices, '
               '%d processes; %d steps of %d examples (%d steps per epoch)',
               config.model.kind, config.attention.projection, config.attention.mechanism,
               f'{params_total:,}', f'{params_attention:,}', jax.device_count(),
               jax.process_count(), num_steps, config.dataset.batch_size,
               train_data.steps_per_epoch)

  writer = metrics_lib.MetricWriter(workdir, enabled=is_writer)
  train_step = steps_lib.make_train_step(task, model, tx, base_key, mesh)
  eval_step = steps_lib.make_eval_step(task, model, mesh)
  speed = _Throughput(config.dataset.batch_size)
  epoch_examples = train_data.steps_per_epoch * config.dataset.batch_size
  recent = collections.deque(maxlen=train_data.steps_per_epoch)  # last epoch's step sums
  pending = []  # (step, device metric sums) not yet fetched
  eval_values = {}

  def flush_pending():
    host = jax.device_get(pending)
    pending.clear()
    try:
      _check_finite(host)
    except FloatingPointError:
      ckpt.close()  # an in-flight save (of an earlier, finite state) completes
      raise
    recent.extend(m for _, m in host)
    return host

  def save(step):
    flush_pending()
    t0 = time.time()
    ckpt.save(step, state.params, state.opt_state)
    speed.exclude(time.time() - t0)

  def evaluate_now(step):
    t0 = time.time()
    values = run_eval(eval_step, state.params, eval_data, mesh)
    writer.write(step, 'eval', values)
    if is_writer:
      print(metrics_lib.progress_line(step, num_steps, values, prefix='eval'), flush=True)
    speed.exclude(time.time() - t0)
    return values

  batches = sharding.prefetch(train_data.batches(start_step), mesh)
  step = start_step
  with preemption.StopOnSignal() as stop:
    while step < num_steps:
      state, step_metrics = train_step(state, next(batches))
      pending.append((step, step_metrics))
      step += 1
      speed.steps += 1
      if step % t.log_every == 0 or step == num_steps:
        values = metrics_lib.reduce_sums(metrics_lib.sum_rows(m for _, m in flush_pending()))
        rate = speed.end_window()
        values.update(learning_rate=float(lr_fn(step - 1)), examples_per_sec=rate,
                      epoch_time_s=epoch_examples / max(rate, 1e-9))
        writer.write(step, 'train', values)
        if is_writer:
          eta = (num_steps - step) * config.dataset.batch_size / max(rate, 1e-9)
          print(metrics_lib.progress_line(step, num_steps, values, examples_per_sec=rate,
                                          eta_s=eta), flush=True)
      if (t.eval_every > 0 and step % t.eval_every == 0) or step == num_steps:
        eval_values = evaluate_now(step)
      if step % t.checkpoint_every == 0 or step == num_steps:
        save(step)
      check_stop = jax.process_count() == 1 or step % t.log_every == 0
      if check_stop and step < num_steps and sharding.any_process(stop.requested):
        save(step)
        ckpt.close()
        writer.close()
        logging.warning('Stopped by %s at step %d/%d: checkpoint saved in %s; re-run the '
                        'same command to resume.', stop.signal_name or 'a signal on another '
                        'process', step, num_steps, ckpt.directory)
        return None

  if not eval_values:  # resumed at the end: evaluate the final state
    eval_values = evaluate_now(step)
  save(step)
  ckpt.close()
  writer.close()
  outputs = _write_outputs(task, config, model, state.params, workdir) if is_writer else {}
  train_values = metrics_lib.reduce_sums(metrics_lib.sum_rows(recent)) if recent else {}
  rate = speed.rate()
  results = {
      **{f'train_{k}': v for k, v in train_values.items()},
      **{f'eval_{k}': v for k, v in eval_values.items()},
      'params_total': params_total,
      'params_trainable': params_trainable,
      'params_per_attention_layer': params_attention,
      'examples_per_sec': rate,
      'epoch_time_s': epoch_examples / max(rate, 1e-9) if rate else None,
      'steps': num_steps,
      'steps_per_epoch': train_data.steps_per_epoch,
      'resumed_from_step': start_step,
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
      **({'outputs': outputs} if outputs else {}),
  }
  if is_writer:
    _write_json(os.path.join(workdir, 'results.json'), results)
    logging.info('Finished: %s accuracy %s, results in %s/results.json',
                 config.dataset.eval_split, eval_values.get('accuracy'), workdir)
  return results


def _restore_or_create_state(config, task, model, tx, mesh, ckpt, init_key):
  """The newest readable checkpoint's state, else a fresh one (from init_from if set)."""
  abstract = steps_lib.abstract_state(task, model, tx, config, mesh)
  restored = ckpt.restore(abstract.params, abstract.opt_state)
  if restored is not None:
    step, params, opt_state = restored
    logging.info('Resumed from the checkpoint at step %d of %s', step, ckpt.directory)
    return steps_lib.TrainState(jax.device_put(np.int32(step), sharding.replicated(mesh)),
                                params, opt_state)
  params = _init_from(config, task, model, mesh, init_key) if config.get('init_from') else None
  return steps_lib.create_train_state(task, model, tx, config, mesh, init_key, params)


def _init_from(config, task, model, mesh, key):
  """Fresh params with every matching leaf of `config.init_from`'s latest checkpoint."""
  fresh = jax.jit(lambda k: steps_lib.init_params(task, model, config, k))(key)
  step, loaded = checkpoint.restore_params(config.init_from, mesh)
  init_params_fn = task.init_params_fn or adapters.init_params_fn(config)
  if init_params_fn is not None:
    params = init_params_fn(config, fresh, loaded)
    logging.info('init_from %s (step %d): merged by the task', config.init_from, step)
    return params
  params, report = checkpoint.merge_params(fresh, loaded)
  logging.info('init_from %s (step %d): %d parameter arrays copied, %d kept fresh (%s), '
               '%d unused', config.init_from, step, len(report['copied']),
               len(report['fresh']), ', '.join(report['fresh'][:8]), len(report['unused']))
  return params


def evaluate(config, workdir: str) -> Dict[str, float]:
  """Evaluates the newest readable checkpoint of `workdir` on `dataset.eval_split`.

  Prints the metrics and writes them, with the step, to `eval_results.json`.
  """
  config, task, model, mesh = _prepare(config)
  abstract = steps_lib.abstract_params(task, model, config, mesh)
  step, params = checkpoint.restore_params(workdir, mesh, abstract)
  eval_data = input_pipeline.get_eval_data(config)
  values = run_eval(steps_lib.make_eval_step(task, model, mesh), params, eval_data, mesh)
  if sharding.is_writer():
    print(metrics_lib.progress_line(step, step, values, prefix='eval'), flush=True)
    _write_outputs(task, config, model, params, workdir)
    _write_json(os.path.join(workdir, 'eval_results.json'),
                {'step': step, 'split': config.dataset.eval_split, **values})
  return values


def _write_outputs(task, config, model, params, workdir: str) -> Dict[str, str]:
  """The task's extra files (pixel_lm: sample PNGs) in `workdir`, on this process."""
  if task.write_outputs is None:
    return {}
  t0 = time.time()
  paths = task.write_outputs(config, model, params, workdir)
  logging.info('Wrote %s in %.1f s', ', '.join(paths.values()), time.time() - t0)
  return paths


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run used (`workdir/config.json`)."""
  with open(os.path.join(workdir, 'config.json')) as f:
    return ml_collections.ConfigDict(json.load(f))


def load_model_and_params(workdir: str, mesh=None):
  """(config, model, params) of a run's newest readable checkpoint, for inference.

  Params are replicated over `mesh` (default: all devices); apply with
  `model.apply({'params': params}, inputs, train=False)`.
  """
  config = load_config(workdir)
  mesh = sharding.create_mesh() if mesh is None else mesh
  task = tasks.get_task(config.task)
  model = task.create_model(config)
  abstract = steps_lib.abstract_params(task, model, config, mesh)
  _, params = checkpoint.restore_params(workdir, mesh, abstract)
  return config, model, params

"""benchmarks.scale's step: the trainer's train step of LRA Text for one (mechanism, device
count, length), compiled from shapes alone, and timed."""

import statistics
import time
from typing import Dict, Optional

import jax
import numpy as np


def config_of(mechanism: str, length: int, devices: int, fv):
  """configs/lra/text.py at --size (or --d_model, --depth), dropout off, batch 1, on the mesh
  {'data': 1, 'fsdp': 1, 'sequence': devices}."""
  from configs.lra import text  # pylint: disable=g-import-not-at-top

  config = text.get_config(f'mechanism={mechanism},max_length={length},size={fv.size}')
  config.model.update(dict(dropout_rate=0.0, attention_dropout_rate=0.0))
  if fv.d_model:
    config.model.update(dict(d_model=fv.d_model, mlp_dim=2 * fv.d_model))
  if fv.depth:
    config.model.depth = fv.depth
  config.dataset.update(dict(batch_size=1, eval_batch_size=1))
  config.train.mesh = dict(data=1, fsdp=1, sequence=devices)
  return config


def batch_of(length: int) -> Dict[str, np.ndarray]:
  """One random batch of one sequence of `length` byte tokens (inputs `[1, length]`)."""
  rng = np.random.default_rng(0)
  return dict(
    inputs=rng.integers(1, 257, size=(1, length)).astype(np.int32),
    label=np.zeros((1,), np.int32),
    mask=np.ones((1,), np.float32),
  )


def build_run(mechanism: str, length: int, devices: int, fv):
  """The trainer's built run (`train.api.build`) on the first `devices` devices."""
  from train import api  # pylint: disable=g-import-not-at-top

  return api.build(
    config_of(mechanism, length, devices, fv),
    num_steps=1000,
    devices=jax.devices()[:devices],
    read_data=False,
    seed=0,
  )


def compiled_step(mechanism: str, length: int, devices: int, fv):
  """(compiled train step, its built run) at `length` on `devices` devices, lowered from
  shapes alone."""
  run = build_run(mechanism, length, devices, fv)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch_of(length).items()}
  return run.train_step.lower(run.abstract_state, batch).compile(), run


def time_steps(compiled, run, length: int, repeats: int) -> Optional[float]:
  """Median seconds of `repeats` calls of the compiled step at `length` after a warm-up
  (None: no repeats), from random parameters (normal, 0.02) and a zero optimiser state."""
  if repeats <= 0:
    return None
  rng = np.random.default_rng(0)
  place = lambda a, x: jax.device_put(x.astype(a.dtype), a.sharding)
  abstract = run.abstract_state  # filled here: no compilation of the initialisation
  state = abstract.replace(
    step=place(abstract.step, np.zeros(())),
    params=jax.tree.map(lambda a: place(a, 0.02 * rng.standard_normal(a.shape)), abstract.params),
    opt_state=jax.tree.map(lambda a: place(a, np.zeros(a.shape)), abstract.opt_state),
  )
  batch = run.to_devices(batch_of(length))
  state, metrics = compiled(state, batch)  # warm-up
  jax.block_until_ready((state, metrics))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  if not np.isfinite(float(metrics['loss'])):
    raise FloatingPointError(f'loss {float(metrics["loss"])} at {length} tokens')
  return statistics.median(times)

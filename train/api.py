"""The trainer's public face: all that tools (benchmarks/, examples/, studies/) use of it.

    run = api.build(config, num_steps=100)      # the trainer's model, state and steps
    state, batches = run.state, run.train_batches()
    for _ in range(100):
      state, metrics = run.train_step(state, next(batches))   # metric sums
    metrics = run.evaluate(state.params)        # mean metrics over the eval split

    config, model, params = api.load(workdir)   # a trained run, for analysis
    logits = model.apply({'params': params}, inputs, train=False)

    results = api.train_and_evaluate(config, workdir)   # what main.py runs
    metrics = api.evaluate(config, workdir)

The data comes from `data`'s public functions (get_train_data,
get_eval_data, get_eval_batch, ...). Everything else in `train/` is the
trainer's own and may change; `tests/project/test_layering.py` holds the tools to this
module. Batches are dicts of arrays (see `data/__init__.py`):
'inputs' `[batch, ...]`, 'label' `[batch]`, 'mask' `[batch]`.
"""

import functools
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

import jax

from configs import fields
from train import adapters
from train import checkpoint
from train import inference
from train import logs
from train import modeling
from train import optim
from train import pyfile
from train import session as session_lib
from train import sharding
from train import steps as steps_lib
from train import trainer
from train import validate
from train import workdir as workdir_lib

ConfigError = validate.ConfigError  # a config the trainer refuses (one line)
Checkpointer = checkpoint.Checkpointer  # the trainer's checkpoint writer (manifest, finiteness)
TrainState = steps_lib.TrainState  # step (int32 scalar), params, opt_state
train_and_evaluate = trainer.train_and_evaluate
evaluate = trainer.evaluate
dummy_inputs = modeling.dummy_inputs  # (config, batch_size) -> zero inputs [batch, ...]
create_model = modeling.create_model  # (config) -> the trainer's Flax model, unbuilt
is_local = fields.is_local  # a path on this machine (not gs://, s3://, ...)
quiet_logs = logs.quiet_logs  # (verbose) absl warnings only, no missing-TPU notice


def config_function(path: str) -> Callable[..., Any]:
  """The `get_config` of the config file at `path`; ValueError naming the file."""
  return pyfile.function(path, 'get_config')


def stored_config(workdir: str):
  """The config a run stored in `workdir` (its config.json, a ConfigDict), or None."""
  return workdir_lib.load_config(workdir)


class Built:
  """A config built as the trainer builds it; see `build`.

  Attributes: `config` (validated and resolved: the mechanism's complete options,
  and with `read_data` the data's facts), `model` (a Flax module), `mesh` (the
  `config.train.mesh` axes 'data', 'fsdp', 'sequence' over the devices), `tx` (the
  optimiser), `task` (the config's task: its `loss_and_metrics(model, params, batch,
  train=...)` is the trainer's loss). `state`, `train_step` and `eval_step` are built
  (and jitted) when first used.
  """

  def __init__(self, session: session_lib.Session, num_steps: int, seed: Optional[int]):
    self._session = session
    self.config, self.model, self.mesh = session.config, session.model, session.mesh
    self.task = session.task
    self.tx = optim.create_optimizer(self.config, num_steps)
    self._key = jax.random.key(self.config.train.seed if seed is None else seed)

  @functools.cached_property
  def state(self) -> steps_lib.TrainState:
    """The initial TrainState (step 0, fresh params), placed on the mesh (replicated, or
    sharded over 'fsdp')."""
    return steps_lib.create_train_state(
      self.model,
      self.tx,
      self._session.inputs,
      self.mesh,
      self._key,
      fsdp_min_size=self._session.fsdp_min_size,
    )

  @functools.cached_property
  def abstract_state(self) -> steps_lib.TrainState:
    """The initial TrainState's shapes and dtypes as `jax.ShapeDtypeStruct`s with their
    shardings on the mesh, computing nothing: `train_step.lower(run.abstract_state,
    batch).compile()` gives XLA's analyses of a step no device has memory for."""
    return steps_lib.abstract_state(
      self.model, self.tx, self._session.inputs, self.mesh, self._session.fsdp_min_size
    )

  @functools.cached_property
  def train_step(self) -> Callable[[Any, Any], Tuple[Any, Dict[str, Any]]]:
    """jit (state, global batch) -> (state, metric sums incl. 'grad_norm' * 'count').

    The trainer's own step; it donates the state passed in (keep the returned one).
    `.lower(state, batch)` lowers it (in the mesh) for XLA's analyses.
    """
    return steps_lib.make_train_step(
      self._session.task, self.model, self.tx, self._key, self.mesh, self._session.fsdp_min_size
    )

  @functools.cached_property
  def eval_step(self) -> Callable[[Any, Any], Dict[str, Any]]:
    """jit (params, global batch) -> the task's metric sums over the batch."""
    return steps_lib.make_eval_step(
      self._session.task, self.model, self.mesh, self._session.fsdp_min_size
    )

  @property
  def num_params(self) -> int:
    """How many numbers the model's parameters hold."""
    return modeling.count_params(self.state.params)

  def train_batches(self, start: int = 0) -> Iterator[Dict[str, Any]]:
    """The config's training batches from step `start`, as global arrays on the mesh."""
    return sharding.prefetch(self._session.train_data().batches(start), self.mesh)

  def to_devices(self, batch: Dict[str, Any]) -> Dict[str, Any]:
    """This process's batch (numpy, `[batch, ...]`) as a global batch on the mesh."""
    return sharding.to_global(batch, self.mesh)

  def restore_params(self, workdir: str) -> Tuple[int, Any]:
    """(step, params) of the newest sound checkpoint of `workdir`, shaped for `model`."""
    return checkpoint.restore_params(workdir, self.mesh, self._session.abstract_params())

  def evaluate(self, params) -> Dict[str, float]:
    """Mean metrics of `params` over every example of the config's eval split."""
    return self._session.evaluate(params, self._session.eval_data())


def build(
  config,
  num_steps: int = 1,
  *,
  devices: Optional[Sequence[Any]] = None,
  read_data: bool = True,
  seed: Optional[int] = None,
) -> Built:
  """The trainer's model, optimiser, initial state and jitted steps for `config`.

  Args:
    config: an experiment config (`configs/*.py`); checked first (ConfigError).
    num_steps: the steps the optimiser's learning-rate schedule spans.
    devices: the mesh's devices (default: all); `config.train.mesh` is laid over them.
    read_data: False skips the data (its checks and facts), for synthetic batches.
    seed: of the initial params and the steps' rngs (default `config.train.seed`).
  """
  session = session_lib.Session(config, read_data=read_data, devices=devices)
  return Built(session, num_steps, seed)


def load(workdir: str, *, merged: bool = False) -> Tuple[Any, Any, Any]:
  """(config, model, params) of the newest sound checkpoint of `workdir`.

  Reads the stored config (config.json), not the data; the params are replicated
  over all devices. `merged`: LoRA adapters folded into the kernels (a plain model,
  params on the host), as generation and export want; without LoRA, no change.
  """
  config, model, params = inference.load(workdir)
  if merged:
    model, params = adapters.unwrap(config, model, jax.device_get(params))
  return config, model, params

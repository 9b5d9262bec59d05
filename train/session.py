"""What one training or evaluation run is built from: `Session`, from the config resolved once.

    session = Session(config)            # every check first (ConfigError), then the mesh
    session.model, session.inputs, session.mesh, session.task, session.loop
    metrics = session.evaluate(params, session.eval_data())

The trainer (`train/trainer.py`) and the public face (`train/api.py`) build on it.
"""

from typing import Dict

import jax

import data
from efficient_attn import registry
from train import memory_check
from train import mesh as mesh_lib
from train import metrics as metrics_lib
from train import modeling
from train import sharding
from train import steps as steps_lib
from train import tasks
from train import validate


class Session:
  """What one training or evaluation run needs, built from the config resolved once.

  `config` (the resolved copy a run records), `dataset` (what the data pipeline is
  handed), `loop` (the training loop's settings), `task`, `attention` (its mechanisms
  configured once, `train/attention.py`), `model` (built with it), `inputs` (example
  inputs, for initialising) and `mesh` (`train/mesh.py`: `config.train.mesh` over
  `devices`, default all, unless a `mesh` is given). `read_data=False` skips the data's
  checks and facts (`validate.resolve`), for a model fed synthetic batches;
  `training=False` skips those of the training split alone (evaluation reads only the
  eval split). A mesh the devices, the batch sizes or the sequence cannot take is a
  ConfigError here, before any work.
  """

  def __init__(
    self, config, mesh=None, read_data: bool = True, training: bool = True, devices=None
  ):
    # every check before any work, the mesh's before the data's (which may generate it)
    resolved = validate.resolve(config, read_data=False, training=training)
    self.config, self.dataset, self.loop = resolved.config, resolved.dataset, resolved.loop
    self.attention = resolved.attention
    self.fsdp_min_size = resolved.loop.fsdp_min_size
    try:
      self.mesh = mesh_lib.create(resolved.loop.mesh, devices) if mesh is None else mesh
      mesh_lib.check_batch(self.mesh, self.config.dataset.batch_size)
      self.data_processes = mesh_lib.data_processes(self.mesh)
    except ValueError as e:
      raise validate.ConfigError(str(e)) from None
    if training:
      refusal = memory_check.check(
        self.config,
        self.attention.declarations,
        resolved.inputs.length,
        processes=self.data_processes[1],
      )
      if refusal:
        raise validate.ConfigError(refusal)
    if read_data:
      validate.read_data_of(resolved, training)
    self.task = tasks.get_task(self.config.task)
    self.model = modeling.create_model(self.config, self.dataset, self.attention)
    self.inputs = resolved.inputs.example()
    if mesh_lib.size(self.mesh, mesh_lib.SEQUENCE_AXIS) > 1:
      self._check_sequence(resolved.inputs.length)
    try:  # what the library refuses when traced (an implementation this platform cannot
      # run, options that do not combine), before any workdir is written
      self.abstract_params()
    except ValueError as e:
      raise validate.ConfigError(str(e).strip().splitlines()[0]) from None

  def _check_sequence(self, length: int) -> None:
    """ConfigError unless the model can split its sequence (`length` tokens) over the
    mesh's 'sequence' axis: a length it divides, a mechanism with a sequence-parallel form,
    and whatever else the library refuses when the model is traced on the mesh."""
    parts = mesh_lib.size(self.mesh, mesh_lib.SEQUENCE_AXIS)
    model = self.config.model
    try:
      if not length:
        raise ValueError(
          f"config.train.mesh['sequence']={parts} needs a model with a sequence; "
          f'config.model.kind={model.kind!r} has none; valid: '
          f"config.train.mesh['sequence']=1"
        )
      mesh_lib.check_length(
        self.mesh, length, f'config.model.kind={model.kind!r} on {self.config.dataset.name!r}'
      )
      whole = self.attention.whole_sequence
      if whole:
        valid = registry.names_where(lambda mechanism: bool(mechanism.sequence_parallel))
        raise ValueError(
          f"config.train.mesh['sequence']={parts} splits the sequence, but "
          f'mechanism {whole[0].name!r} cannot: {whole[0].whole_sequence}; '
          f"valid choices: {', '.join(valid)}; or config.train.mesh"
          f"['sequence']=1"
        )
      rate = model.attention_dropout_rate
      if rate > 0:  # the library refuses it in training only: here, before any work
        raise ValueError(
          f'config.model.attention_dropout_rate={rate} with config.train.mesh'
          f"['sequence']={parts}: attention-weight dropout is not split over "
          f'devices; valid: attention_dropout_rate=0, or config.train.mesh'
          f"['sequence']=1"
        )
    except ValueError as e:
      raise validate.ConfigError(str(e).strip().splitlines()[0]) from None

  def abstract_params(self):
    return steps_lib.abstract_params(self.model, self.inputs, self.mesh, self.fsdp_min_size)

  def train_data(self):
    """This process's training stream: its slice of each global batch (`data_processes`)."""
    index, count = self.data_processes
    return data.get_train_data(self.dataset, process_index=index, process_count=count)

  def eval_data(self):
    """This process's evaluation batches of the eval split: any `eval_batch_size`, its
    share rounded up to a multiple of the devices this process's rows are split over
    and padded with rows of mask 0, which count for nothing in any metric."""
    index, count = self.data_processes
    return data.get_eval_data(
      self.dataset,
      process_index=index,
      process_count=count,
      row_multiple=mesh_lib.batch_devices(self.mesh) // count,
    )

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

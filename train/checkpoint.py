"""Orbax checkpoints of a run: `workdir/checkpoints/<step>/{params,opt_state}`.

    ckpt = checkpoint.Checkpointer(workdir, keep=3)
    ckpt.save(step, params, opt_state)          # refuses non-finite params
    restored = ckpt.restore(abstract_params, abstract_opt_state)  # (step, params, opt) | None
    step, params = checkpoint.restore_params(workdir)   # latest params, any model

The step is the checkpoint's name; the data order and per-step rngs are
functions of it, so nothing else needs saving. Orbax writes each step in a
temporary directory and renames it when complete, so a run killed while
saving leaves no half-written step behind; a step that is nevertheless
unreadable (a corrupted disk, a truncated copy) is skipped with a warning and
the previous one restored. All processes call save/restore (Orbax coordinates
multi-host writes).
"""
import logging as logging_std
import os
from typing import Any, Optional, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from train import models
from train import sharding


class _OrbaxInfoFilter(logging_std.Filter):
  """Drops Orbax's INFO chatter (tens of lines per save) from the absl log."""

  def filter(self, record):
    return record.levelno > logging_std.INFO or f'{os.sep}orbax{os.sep}' not in record.pathname


def quiet_orbax_logging() -> None:
  logger = logging_std.getLogger('absl')
  if not any(isinstance(f, _OrbaxInfoFilter) for f in logger.filters):
    logger.addFilter(_OrbaxInfoFilter())


ITEMS = ('params', 'opt_state')


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


@jax.jit
def _all_finite(tree) -> jnp.ndarray:
  leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.stack(leaves).all() if leaves else jnp.bool_(True)


def all_finite(tree) -> bool:
  return bool(_all_finite(tree))


class Checkpointer:
  """Saves every N steps (the caller decides), keeps the last `keep`."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True,
               create: bool = True):
    quiet_orbax_logging()
    self.directory = checkpoint_dir(workdir)
    if not create and not os.path.isdir(self.directory):
      raise FileNotFoundError(f'no checkpoints directory {self.directory}')
    self.manager = ocp.CheckpointManager(
        self.directory,
        item_handlers={name: ocp.StandardCheckpointHandler() for name in ITEMS},
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                             enable_async_checkpointing=async_save))
    self.unreadable = set()  # steps `restore` skipped: `save` replaces them

  def steps(self):
    return sorted(self.manager.all_steps())

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def save(self, step: int, params, opt_state) -> None:
    """Saves `step`; raises FloatingPointError (saving nothing) if params are not finite.

    An existing readable checkpoint of `step` is kept; an unreadable one (seen
    by `restore`) is replaced.
    """
    if not all_finite(params):
      self.manager.wait_until_finished()  # an earlier step's save still completes
      raise FloatingPointError(f'parameters at step {step} are not finite (NaN/Inf); '
                               f'refusing to write a checkpoint')
    if step in self.manager.all_steps():
      if step not in self.unreadable:
        return
      logging.warning('Replacing the unreadable checkpoint at step %d', step)
      self.manager.delete(step)
      self.unreadable.discard(step)
    self.manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state)))

  def restore(self, abstract_params=None, abstract_opt_state=None, mesh=None
              ) -> Optional[Tuple[int, Any, Any]]:
    """The newest readable checkpoint as (step, params, opt_state), or None.

    The abstract trees (`jax.ShapeDtypeStruct`s with shardings) fix structure
    and placement. Without `abstract_params` the structure and shapes are read
    from the checkpoint and the params replicated over `mesh` (default: all
    devices), which restores a model other than the current one (init_from).
    opt_state is restored only when `abstract_opt_state` is given.
    """
    for step in reversed(self.steps()):
      try:
        target = (self.saved_params(step, mesh) if abstract_params is None
                  else abstract_params)
        items = {'params': ocp.args.StandardRestore(target)}
        if abstract_opt_state is not None:
          items['opt_state'] = ocp.args.StandardRestore(abstract_opt_state)
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
      except Exception as e:  # pylint: disable=broad-except
        first_line = str(e).splitlines()[0] if str(e) else ''
        logging.warning('Checkpoint at step %d in %s is unreadable (%s: %s); falling back '
                        'to the previous one', step, self.directory, type(e).__name__,
                        first_line)
        self.unreadable.add(step)
        continue
      return step, restored['params'], restored.get('opt_state')
    return None

  def saved_params(self, step: int, mesh=None):
    """The params tree saved at `step` as ShapeDtypeStructs replicated over `mesh`."""
    repl = sharding.replicated(sharding.create_mesh() if mesh is None else mesh)
    metadata = self.manager.item_metadata(step)['params']
    tree = getattr(metadata, 'tree', metadata)
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=repl),
                        tree)

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def restore_params(workdir: str, mesh=None, abstract_params=None) -> Tuple[int, Any]:
  """(step, params) of the newest readable checkpoint of `workdir`.

  See `Checkpointer.restore`; raises FileNotFoundError if none is readable.
  """
  ckpt = Checkpointer(workdir, async_save=False, create=False)
  try:
    restored = ckpt.restore(abstract_params, mesh=mesh)
  finally:
    ckpt.close()
  if restored is None:
    raise FileNotFoundError(f'no readable checkpoint in {ckpt.directory}')
  return restored[0], restored[1]


def merge_params(fresh, loaded):
  """Copies every leaf of `loaded` whose path and shape match into `fresh`.

  Returns (params, report) where report lists 'copied', 'fresh' (kept their
  initialisation: new or reshaped, e.g. a new head or LoRA factors) and
  'unused' (in the checkpoint only) parameter paths.
  """
  flat_loaded = {models.path_str(p): x
                 for p, x in jax.tree_util.tree_flatten_with_path(loaded)[0]}
  report = {'copied': [], 'fresh': [], 'unused': []}

  def pick(path, x):
    name = models.path_str(path)
    old = flat_loaded.get(name)
    if old is not None and old.shape == x.shape:
      report['copied'].append(name)
      return old.astype(x.dtype)
    report['fresh'].append(name)
    return x
  params = jax.tree_util.tree_map_with_path(pick, fresh)
  used = set(report['copied'])
  report['unused'] = sorted(set(flat_loaded) - used)
  return params, report

"""Orbax checkpoints of a run: `workdir/checkpoints/<step>/{params,opt_state}`.

    ckpt = checkpoint.Checkpointer(workdir, every=1000, keep=3)
    ckpt.save(step, params, opt_state)        # at the cadence; force=True for the last / SIGTERM
    restored = ckpt.restore(abstract_params, abstract_opt_state)  # (step, params, opt) | None
    restored = ckpt.resume(abstract_params, abstract_opt_state)   # the same, for training
    step, params = checkpoint.restore_params(workdir)   # latest params, any model

The step is the checkpoint's name; the data order and per-step rngs are
functions of it, so nothing else needs saving. Orbax writes each step in the
background (the loop goes on) into a temporary directory and renames it when
complete, so a run killed while saving leaves the previous step intact.

Integrity (`checkpoint_integrity.py`): each save also records a manifest,
`checkpoints/<step>.manifest.json` (written whole or not at all), with the shape, dtype
and CRC-32 of every array. Restoring checks it (and that every value is finite); a
damaged step is skipped with a warning naming it and why, and the previous one is used.
Damage includes the files that describe a step: a manifest that is missing (a step is
never trusted without its check), empty or unreadable, and an Orbax
`_CHECKPOINT_METADATA` that is missing or that Orbax cannot read. Nothing is deleted: a
damaged step is moved to `<workdir>/damaged_checkpoints/` when training reaches it again
(and the steps below it are saved again, which Orbax would skip while it is the newest).
A run that has checkpoints, none of them sound, is not started over: `resume` raises
`CheckpointDamaged`, one line naming the steps. A checkpoint whose shapes differ from
the model's is not damage: restoring it raises `CheckpointMismatch`.
A failed save stops the run with `CheckpointSaveError`, one line naming the
path; a full disk says so and from which step the re-run resumes (Orbax's own
tracebacks of it, from its background threads, are left out of the log).
"""

import contextlib
import json
import os
from typing import Any, Optional, Tuple

from absl import logging
from etils import epath
import jax
import orbax.checkpoint as ocp

from configs import fields
from train import checkpoint_integrity as integrity
from train import checkpoint_logs
from train import sharding
from train import workdir as workdir_lib

ITEMS = integrity.ITEMS
DAMAGED = integrity.DAMAGED
all_finite = integrity.all_finite
manifest = integrity.manifest


class CheckpointMismatch(ValueError):
  """A checkpoint holds arrays of other shapes than the model's: another model's run."""


class CheckpointSaveError(RuntimeError):
  """Writing a checkpoint failed; the run stops rather than go on unsaved."""


class CheckpointDamaged(RuntimeError):
  """A run has checkpoints and none can be trusted: it is not started over silently."""


def checkpoint_dir(workdir) -> epath.Path:
  """`<workdir>/checkpoints`; a local workdir made absolute (Orbax refuses relative paths)."""
  if fields.is_local(workdir):
    workdir = os.path.abspath(os.fspath(workdir))
  return epath.Path(workdir) / 'checkpoints'


def _shape_differences(saved_tree, abstract) -> list:
  saved = {
    jax.tree_util.keystr(p): tuple(m.shape)
    for p, m in jax.tree_util.tree_flatten_with_path(saved_tree)[0]
  }
  want = {
    jax.tree_util.keystr(p): tuple(a.shape)
    for p, a in jax.tree_util.tree_flatten_with_path(abstract)[0]
  }
  diffs = [
    f'{k}: saved {saved[k]}, model {want[k]}'
    for k in sorted(set(saved) & set(want))
    if saved[k] != want[k]
  ]
  diffs += [f'{k}: only in the checkpoint' for k in sorted(set(saved) - set(want))]
  diffs += [f'{k}: only in the model' for k in sorted(set(want) - set(saved))]
  return diffs


class Checkpointer:
  """Saves every `every` steps (and when forced), keeps the last `keep`, restores verified."""

  def __init__(
    self, workdir, every: int = 1000, keep: int = 3, async_save: bool = True, create: bool = True
  ):
    checkpoint_logs.quiet_orbax_logging()
    self.directory = checkpoint_dir(workdir)
    if not create and not self.directory.is_dir():
      raise FileNotFoundError(f'no checkpoints directory {self.directory}')
    try:
      self.manager = ocp.CheckpointManager(
        self.directory,
        item_handlers={name: ocp.StandardCheckpointHandler() for name in ITEMS},
        options=ocp.CheckpointManagerOptions(
          max_to_keep=keep,
          create=create,
          enable_async_checkpointing=async_save,
          # Each step's _CHECKPOINT_METADATA is read by `restore` (a damaged one is
          # skipped), not here, where a damaged one stops the manager's creation.
          lightweight_initialize=True,
          save_decision_policy=ocp.checkpoint_managers.AnySavePolicy(
            [
              ocp.checkpoint_managers.FixedIntervalPolicy(every),
              ocp.checkpoint_managers.PreemptionCheckpointingPolicy(),
            ]
          ),
        ),
      )
    except OSError as e:
      if workdir_lib.is_disk_full(e):
        raise CheckpointSaveError(self._disk_full(e, e.filename or self.directory)) from None
      raise CheckpointSaveError(f'cannot create checkpoints in {self.directory}: {e}') from None
    self.unreadable = set()  # steps `restore` skipped: `save` sets them aside

  def steps(self):
    return sorted(self.manager.all_steps())

  def reached_preemption(self, step: int) -> bool:
    """Orbax's preemption sync point (multi-host runs with jax.distributed)."""
    return self.manager.reached_preemption(step)

  def save(self, step: int, params, opt_state, force: bool = False) -> bool:
    """Saves `step` if the cadence (or `force`) says so; returns whether it did.

    Raises FloatingPointError (saving nothing) if params are not finite, and
    CheckpointSaveError naming the path if this or an earlier write failed.
    """
    self._set_aside_damaged(step)
    if not force and not self.manager.should_save(step):
      return False
    self.check()
    if step in self.manager.all_steps():
      return False
    if not all_finite(params):
      self.manager.wait_until_finished()  # an earlier step's save still completes
      raise FloatingPointError(
        f'parameters at step {step} are not finite (NaN/Inf); refusing to write a checkpoint'
      )
    path = integrity.manifest_path(self.directory, step)
    try:
      workdir_lib.write_atomic(
        path, json.dumps({name: manifest(tree) for name, tree in zip(ITEMS, (params, opt_state))})
      )
    except OSError as e:
      with contextlib.suppress(Exception):  # the save in flight, if any, ends first
        self.manager.wait_until_finished()
      self._drop_unwritten_manifests()  # this step's, and that save's if it failed too
      if workdir_lib.is_disk_full(e):
        raise CheckpointSaveError(self._disk_full(e, path)) from None
      raise CheckpointSaveError(
        f'saving the checkpoint at step {step} in {self.directory} failed: {e}'
      ) from None
    try:
      self.manager.save(
        step,
        force=True,
        args=ocp.args.Composite(
          params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state)
        ),
      )
    except Exception as e:  # pylint: disable=broad-except  (this save's, or an earlier one's)
      path.unlink(missing_ok=True)  # the step was not written: no manifest without it
      raise self._save_error(
        e, f'saving the checkpoint at step {step} in {self.directory} failed'
      ) from None
    self._prune_manifests(step)
    return True

  def _set_aside_damaged(self, step: int) -> None:
    """Moves the damaged steps `restore` skipped at or above `step` out of Orbax's sight
    (`checkpoint_integrity.set_aside`): training writes those steps again, and Orbax
    saves no step at or below its newest. Raises CheckpointSaveError if one cannot move."""
    damaged = sorted(s for s in self.unreadable if s >= step)
    if not damaged:
      return
    for old in damaged:
      if jax.process_index() == 0:
        try:
          where = integrity.set_aside(self.directory, old)
        except Exception as e:  # pylint: disable=broad-except  (OSError; a remote store's)
          raise CheckpointSaveError(
            f'cannot move the damaged checkpoint at step {old} out of {self.directory} '
            f'({type(e).__name__}: {e}); move it elsewhere by hand and re-run'
          ) from None
        logging.warning(
          'Moved the damaged checkpoint at step %d to %s (kept, not deleted); training '
          'saves that step again',
          old,
          where,
        )
      self.unreadable.discard(old)
    if jax.process_count() > 1:
      ocp.multihost.sync_global_processes('checkpoint_set_aside_damaged')
    self.manager.reload()

  def _disk_full(self, error, target) -> str:
    """The one line of a full disk, naming the step the re-run resumes from."""
    return workdir_lib.disk_full_message(error, target, self.directory.parent)

  def _save_error(self, error, what: str) -> CheckpointSaveError:
    """`what` failed with `error` (Orbax's, or the OS's), in one line. The manifests of
    steps that were not written (this failed save's) are deleted."""
    self._drop_unwritten_manifests()
    if workdir_lib.is_disk_full(error):
      return CheckpointSaveError(self._disk_full(error, self.directory))
    text = str(error).strip()
    return CheckpointSaveError(f'{what}: {text.splitlines()[-1] if text else type(error).__name__}')

  def check(self) -> None:
    """Raises CheckpointSaveError if a background save has failed."""
    try:
      self.manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(e, f'saving a checkpoint in {self.directory} failed') from None

  def _drop_unwritten_manifests(self) -> None:
    """Deletes the manifests of steps without a checkpoint, after a failed save (no save
    is in flight then); any that remain are never trusted."""
    for path in self.directory.glob('*.manifest.json'):
      step = path.name.split('.')[0]
      if step.isdigit() and not (self.directory / step).exists():
        path.unlink(missing_ok=True)

  def _prune_manifests(self, current: int) -> None:
    """Deletes the manifests of steps Orbax no longer keeps."""
    keep = set(self.manager.all_steps()) | {current}
    for path in self.directory.glob('*.manifest.json'):
      step = path.name.split('.')[0]
      if step.isdigit() and int(step) not in keep:
        path.unlink()

  def restore(
    self, abstract_params=None, abstract_opt_state=None, mesh=None
  ) -> Optional[Tuple[int, Any, Any]]:
    """The newest sound checkpoint as (step, params, opt_state), or None.

    The abstract trees (`jax.ShapeDtypeStruct`s with shardings) fix structure
    and placement. Without `abstract_params` the structure and shapes are read
    from the checkpoint and the params replicated over `mesh` (default: all
    devices), which restores a model other than the current one (init_from).
    opt_state is restored only when `abstract_opt_state` is given.

    Raises CheckpointMismatch when the newest checkpoint's shapes differ from
    the abstract params (another model's run): nothing is skipped or deleted.
    """
    for step in reversed(self.steps()):
      want, damage = integrity.check_files(self.directory, step)
      if damage:
        self._skip(step, damage)
        continue
      try:
        saved = self.saved_params(step, mesh)
      except Exception as e:  # pylint: disable=broad-except
        self._skip(step, f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}')
        continue
      if abstract_params is not None:
        diffs = _shape_differences(saved, abstract_params)
        if diffs:
          raise CheckpointMismatch(
            f'the checkpoint at step {step} in {self.directory} belongs to another model '
            f'({len(diffs)} arrays differ, e.g. {diffs[0]}); use a new workdir'
          )
      try:
        items = {
          'params': ocp.args.StandardRestore(saved if abstract_params is None else abstract_params)
        }
        if abstract_opt_state is not None:
          items['opt_state'] = ocp.args.StandardRestore(abstract_opt_state)
        restored = dict(self.manager.restore(step, args=ocp.args.Composite(**items)))
      except Exception as e:  # pylint: disable=broad-except
        self._skip(step, f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}')
        continue
      damage = integrity.verify(want, restored)
      if damage:
        self._skip(step, damage)
        continue
      return step, restored['params'], restored.get('opt_state')
    return None

  def resume(self, abstract_params, abstract_opt_state, mesh=None):
    """`restore` for a run that goes on training: None means a run without checkpoints.

    Raises CheckpointDamaged, one line naming the steps and the ways on, when the run has
    checkpoints and none can be trusted (it used to start over and replace them)."""
    restored = self.restore(abstract_params, abstract_opt_state, mesh)
    if restored is None and self.unreadable:
      raise CheckpointDamaged(
        f'{integrity.untrusted(self.directory, self.unreadable)}; the run does not start '
        f'over on top of them: repair those steps (or move them out of {self.directory}) '
        'and re-run, or re-run with --restart to move this run aside and start a new one'
      )
    return restored

  def _skip(self, step: int, why: str) -> None:
    earlier = any(s < step for s in self.manager.all_steps())
    logging.warning(
      'The checkpoint at step %d (%s) is damaged: %s; %s',
      step,
      self.directory / str(step),
      why,
      'falling back to the previous one' if earlier else 'no earlier checkpoint',
    )
    self.unreadable.add(step)

  def saved_params(self, step: int, mesh=None):
    """The params tree saved at `step` as ShapeDtypeStructs replicated over `mesh`."""
    repl = sharding.replicated(sharding.create_mesh() if mesh is None else mesh)
    metadata = self.manager.item_metadata(step)['params']
    tree = getattr(metadata, 'tree', metadata)
    return jax.tree.map(
      lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=repl), tree
    )

  @contextlib.contextmanager
  def finishing(self):
    """Lets an in-flight background save complete if the block raises (so the
    previous sound checkpoint stays usable and nothing is torn down mid-write)."""
    try:
      yield
    except BaseException:
      try:
        self.manager.wait_until_finished()
      except Exception:  # pylint: disable=broad-except  (the first error wins)
        self._drop_unwritten_manifests()
      raise

  def close(self) -> None:
    """Waits for the save in flight and closes the manager; CheckpointSaveError if a save
    failed (the manager is closed then too)."""
    try:
      try:
        self.manager.wait_until_finished()
      except Exception as e:  # pylint: disable=broad-except
        raise self._save_error(e, f'saving a checkpoint in {self.directory} failed') from None
      self.check()
      try:
        self.manager.close()  # waits for Orbax's checkpointer: an error may surface here
      except Exception as e:  # pylint: disable=broad-except
        raise self._save_error(e, f'saving a checkpoint in {self.directory} failed') from None
    except CheckpointSaveError:
      with contextlib.suppress(Exception):  # the save's error is the one to report
        self.manager.close()
      raise


def restore_params(workdir, mesh=None, abstract_params=None) -> Tuple[int, Any]:
  """(step, params) of the newest sound checkpoint of `workdir`.

  See `Checkpointer.restore`; raises FileNotFoundError if none is readable.
  """
  ckpt = Checkpointer(workdir, async_save=False, create=False)
  try:
    restored = ckpt.restore(abstract_params, mesh=mesh)
  finally:
    ckpt.manager.close()
  if restored is None and ckpt.unreadable:
    raise FileNotFoundError(integrity.untrusted(ckpt.directory, ckpt.unreadable))
  if restored is None:
    raise FileNotFoundError(f'no readable checkpoint in {ckpt.directory}')
  return restored[0], restored[1]

"""An open workdir (`open_run`, a `Run`): its identity checked, its lock held, its config
stored.

The run's length (`train.num_steps`, or `num_epochs` whole epochs) may grow on
resume, never shrink: a finished run asked for more steps continues from its
final checkpoint (its results.json kept as `results.<steps>-steps.json`), and
a workdir trained past the asked length is refused. config.json always
describes the run whose results and checkpoints the workdir holds.
"""

import datetime
import json
from typing import Any, Dict, Optional

from absl import logging
from etils import epath

from train.workdir import atomic
from train.workdir import errors
from train.workdir import identity
from train.workdir import layout
from train.workdir import lock as lock_lib


def total_steps(train, steps_per_epoch: int) -> int:
  """The run's length in steps: `train.num_steps`, else `train.num_epochs` whole epochs."""
  return train.num_steps if train.num_steps > 0 else train.num_epochs * steps_per_epoch


def steps_beyond(config, results: Dict[str, Any]) -> int:
  """Steps `config` asks for beyond a finished run's results.json (< 0: it asks for fewer)."""
  if 'steps_per_epoch' not in results and config.train.num_steps <= 0:
    return 0  # an older results.json: nothing to compare with
  return total_steps(config.train, results.get('steps_per_epoch', 0)) - results['steps']


class Run:
  """An open workdir: its identity checked, its lock held (on the writing process).

  `finished`: the workdir holds the results of exactly the asked number of
  steps (nothing to do; config.json is left as it is).
  """

  def __init__(self, path, config, *, writer: bool, num_steps: Optional[int] = None):
    self.path = epath.Path(path)
    self.writer = writer
    self._lock = lock_lib.Lock(self.path)
    if writer:
      try:
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
      except OSError as e:
        raise errors.WorkdirError(errors.unwritable(self.path, e)) from None
    try:
      self.finished = self._check_length(config, num_steps)
      if writer and not self.finished:
        try:
          atomic.write_json(self.path, layout.CONFIG, json.loads(config.to_json_best_effort()))
        except OSError as e:
          raise errors.WorkdirError(errors.unwritable(self.path, e)) from None
    except BaseException:
      self.close()
      raise

  def _check_length(self, config, num_steps: Optional[int]) -> bool:
    """Whether the run is finished at `num_steps`; continues a shorter finished run,
    refuses a longer one (WorkdirError, nothing written)."""
    results = self.results
    if num_steps is None:
      return results is not None
    done = results['steps'] if results is not None else 0
    newest = max(layout.checkpoint_steps(self.path), default=0)
    if max(done, newest) > num_steps:
      what = (
        f'its results.json is from step {done}'
        if done >= newest
        else f'its newest checkpoint is at step {newest}'
      )
      t = config.train
      asked = (
        f'train.num_steps={t.num_steps}'
        if t.num_steps > 0
        else f'train.num_epochs={t.num_epochs}: {num_steps} steps'
      )
      raise errors.WorkdirError(
        f'{self.path} has trained further than this config asks ({what}; {asked}): the '
        f'length may grow on resume, not shrink. Use a new --workdir '
        f'(--config.init_from={self.path} starts from its weights), or --restart'
      )
    if results is None:
      return False
    if done == num_steps:
      return True
    if self.writer:
      kept = self.path / f'results.{done}-steps.json'
      (self.path / layout.RESULTS).replace(kept)
      logging.warning(
        '%s finished at step %d; continuing it to step %d from its final '
        'checkpoint (its results are kept in %s)',
        self.path,
        done,
        num_steps,
        kept.name,
      )
    return False

  @property
  def results(self) -> Optional[Dict[str, Any]]:
    """The finished run's results.json, or None."""
    file = self.path / layout.RESULTS
    return json.loads(file.read_text()) if file.exists() else None

  def close(self) -> None:
    self._lock.release()


def open_run(
  path, config, *, writer: bool = True, restart: bool = False, num_steps: Optional[int] = None
) -> Run:
  """Checks the workdir's identity (or moves the old run aside), locks it, stores the config.

  `restart` takes the workdir's lock before moving the old run aside, so it is
  refused (WorkdirError) while another trainer holds it. `num_steps`: the run's
  length, checked against what the workdir holds (see the module docstring).
  """
  path = epath.Path(path)
  if restart and (path / layout.CONFIG).exists():
    if writer:
      lock = lock_lib.Lock(path)
      try:
        lock.acquire()
      except OSError as e:
        raise errors.WorkdirError(errors.unwritable(path, e)) from None
      stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
      aside = path.parent / f'{path.name}.replaced-{stamp}'
      try:
        path.rename(aside)
      except OSError as e:
        lock.release()
        raise errors.WorkdirError(errors.unwritable(path, e)) from None
      except BaseException:
        lock.release()
        raise
      (aside / layout.LOCK).unlink(missing_ok=True)  # ours, moved with the folder
      logging.warning('--restart: moved the previous run in %s to %s', path, aside)
  else:
    identity.check_identity(path, config)
  return Run(path, config, writer=writer, num_steps=num_steps)

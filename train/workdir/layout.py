"""What a workdir holds: the names of its files, and the steps of its checkpoints.

    <workdir>/config.json         the run's identity (`identity.py`)
    <workdir>/results.json        a finished run's results (`run.py`)
    <workdir>/trainer.lock        the trainer that holds it (`lock.py`)
    <workdir>/checkpoints/<step>  Orbax's checkpoints
    <workdir>/damaged_checkpoints/<step>  damaged ones, set aside, never deleted

Besides these, the trainer writes its metrics, logs and samples there.
"""

from typing import List

from etils import epath

CONFIG = 'config.json'
RESULTS = 'results.json'
LOCK = 'trainer.lock'
DAMAGED_CHECKPOINTS = 'damaged_checkpoints'


def checkpoint_steps(path) -> List[int]:
  """The steps of `path/checkpoints/<step>` folders (Orbax's temporary ones excluded)."""
  folder = epath.Path(path) / 'checkpoints'
  if not folder.is_dir():
    return []
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())

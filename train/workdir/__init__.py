"""A workdir: the config that made it, one trainer at a time, files written whole.

    run = workdir.open_run(path, config, restart=False)   # before any other write
    ...
    run.close()

`config.json` is the workdir's identity (`identity.py`): a config whose fields differ
from the stored ones, other than those in `MAY_CHANGE`, is refused before anything is
written. A lock file keeps a second trainer out of a workdir in use (`lock.py`). The
run's length may grow on resume, never shrink (`run.py`). Every JSON file written here
is strict JSON, written whole or not at all (`atomic.py`). A write that fails (a full
disk, a read-only folder, a file where the workdir should be) is a WorkdirError in one
line naming the path (`errors.py`). Without --workdir, a command's workdir is
named after its config (`naming.py`); `layout.py` names the files.

This package's face holds the names the trainer, the sweep and the tests use.
"""

from train.workdir.atomic import dumps
from train.workdir.atomic import write_atomic
from train.workdir.atomic import write_json
from train.workdir.errors import WorkdirError
from train.workdir.errors import disk_full_message
from train.workdir.errors import is_disk_full
from train.workdir.errors import unwritable
from train.workdir.errors import write_failure
from train.workdir.identity import ADDED_DEFAULTS
from train.workdir.identity import FROM_DATA
from train.workdir.identity import MAY_CHANGE
from train.workdir.identity import check_identity
from train.workdir.identity import differences
from train.workdir.identity import load_config
from train.workdir.identity import may_change
from train.workdir.identity import with_added_options
from train.workdir.layout import CONFIG
from train.workdir.layout import DAMAGED_CHECKPOINTS
from train.workdir.layout import LOCK
from train.workdir.layout import RESULTS
from train.workdir.layout import checkpoint_steps
from train.workdir.naming import RUNS
from train.workdir.naming import default_workdir
from train.workdir.naming import eval_workdir
from train.workdir.run import Run
from train.workdir.run import open_run
from train.workdir.run import steps_beyond
from train.workdir.run import total_steps

__all__ = [
  'ADDED_DEFAULTS',
  'CONFIG',
  'DAMAGED_CHECKPOINTS',
  'FROM_DATA',
  'LOCK',
  'MAY_CHANGE',
  'RESULTS',
  'RUNS',
  'Run',
  'WorkdirError',
  'check_identity',
  'checkpoint_steps',
  'default_workdir',
  'differences',
  'disk_full_message',
  'dumps',
  'eval_workdir',
  'is_disk_full',
  'load_config',
  'may_change',
  'open_run',
  'steps_beyond',
  'total_steps',
  'unwritable',
  'with_added_options',
  'write_atomic',
  'write_failure',
  'write_json',
]

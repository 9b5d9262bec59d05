"""Where generated datasets are written once: the cache folder.

MQAR, the generated Long Range Arena tasks (ListOps, Pathfinder) and a byte corpus's
windows are written once under `cache_root()`: a local folder, or a bucket URL (every
file goes through `files.gfile`). The config presets (`configs/presets.py`) store the
folder in `dataset.data_dir`, which is all the data package reads.
"""

import os

CACHE_VARIABLE = 'EFFICIENT_ATTN_CACHE'


def cache_root() -> str:
  """The folder generated datasets are written to once: $EFFICIENT_ATTN_CACHE when set
  (a local folder or a bucket URL), else $XDG_CACHE_HOME/efficient_attn (when set to an
  absolute path, as the XDG spec asks), else ~/.cache/efficient_attn."""
  root = os.environ.get(CACHE_VARIABLE, '')
  if root:
    return os.path.expanduser(root)
  xdg = os.environ.get('XDG_CACHE_HOME', '')
  base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'efficient_attn')


def cache_dir(name: str) -> str:
  """Where a generated dataset is written once: `cache_root()`/<name>."""
  return os.path.join(cache_root(), name)


def lra_cache(task: str) -> str:
  """Where a generated Long Range Arena task is written once: `cache_root()`/lra/<task>."""
  return os.path.join(cache_root(), 'lra', task)

"""The workdir of a command without --workdir: named after its config.

    configs/cifar10_nystrom.py                     -> runs/cifar10_nystrom
    configs/cifar10.py:linear --config.model.depth=4 -> runs/cifar10-linear-<hash>

`default_workdir` names the run a training command makes; `eval_workdir` finds the run
that the same command with --mode=eval evaluates.
"""

import hashlib
import itertools
import json
import os
import re

from train.workdir import identity
from train.workdir import layout

RUNS = 'runs'


def default_workdir(config_arg: str, overrides=None, evaluating: bool = False) -> str:
  """The workdir of a config named on the command line, when --workdir is not given.

  'configs/cifar10_nystrom.py' -> 'runs/cifar10_nystrom'; 'configs/cifar10.py:linear'
  -> 'runs/cifar10-linear'; 'configs/lra/listops.py:performer' ->
  'runs/lra/listops-performer'; any --config.* overrides (a {field: value} dict) add a
  short hash of their sorted values, so another config never shares the folder.
  `evaluating` (--mode=eval): overrides of what an evaluation may change
  (`identity.MAY_CHANGE`: the eval split, batch size, data location) name the same run.
  """
  if evaluating and overrides:
    overrides = {k: v for k, v in overrides.items() if not identity.may_change(k)}
  path, _, arg = config_arg.partition(':')
  path = os.path.normpath(path)
  parts = path.split(os.sep)
  if 'configs' in parts:  # relative to the (last) configs/ folder
    parts = parts[len(parts) - parts[::-1].index('configs') :]
  else:
    parts = parts[-1:]
  parts[-1] = os.path.splitext(parts[-1])[0]
  name = os.path.join(*parts)
  if arg:
    name += '-' + (re.sub(r'[^A-Za-z0-9._]+', '-', arg).strip('-') or 'arg')
  if overrides:
    text = json.dumps(dict(overrides), sort_keys=True, default=repr)
    name += '-' + hashlib.sha256(text.encode()).hexdigest()[:8]
  return os.path.join(RUNS, name)


def eval_workdir(config_arg: str, overrides=None, holds_run=None) -> str:
  """The workdir --mode=eval evaluates when --workdir is not given.

  The first that holds a run (`holds_run(path)`, default: it has a config.json) of
  the workdirs of `config_arg` with all the --config.* `overrides`, then with fewer of
  those an evaluation may change (`identity.MAY_CHANGE`), fewest left out first: the
  training command plus --mode=eval evaluates the run it trained, and
  `--config.dataset.eval_split=train` added evaluates it too. None holds a run:
  `default_workdir(..., evaluating=True)`.
  """
  overrides = dict(overrides or {})
  holds_run = holds_run or (lambda path: os.path.exists(os.path.join(path, layout.CONFIG)))
  changeable = sorted(k for k in overrides if identity.may_change(k))
  for n in range(len(changeable) + 1):
    for left_out in itertools.combinations(changeable, n):
      path = default_workdir(config_arg, {k: v for k, v in overrides.items() if k not in left_out})
      if holds_run(path):
        return path
  return default_workdir(config_arg, overrides, evaluating=True)

"""A sweep's runs: its definition file expanded into named runs, and each run's workdir,
main.py flags and config (built exactly as main.py builds it). `train/sweep.py` checks,
lists and runs them.

    runs = sweep_runs.expand(sweep_runs.load_sweep('sweeps/mnist_projections.py'), root)
    config = sweep_runs.build_config(runs[0])    # SweepError: one line per problem
"""

import dataclasses
import itertools
import os
import sys
from typing import Any, Dict, List, Mapping, Sequence

from absl import flags
from etils import epath
from ml_collections import config_flags

from train import pyfile


class SweepError(ValueError):
  """A sweep definition or one of its runs is not valid."""


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  config: str
  overrides: Mapping[str, Any]


def load_sweep(spec: str) -> Dict[str, Any]:
  """The definition of the sweep file `spec`, 'path.py' or 'path.py:key=value,...'."""
  try:
    return pyfile.call(spec, 'get_sweep')
  except ValueError as e:
    raise SweepError(f'sweep file {e}') from None


def _short(value: Any) -> str:
  """'configs/cifar10.py:nystrom' -> 'cifar10-nystrom'; other values as text."""
  if isinstance(value, str) and (value.endswith('.py') or '.py:' in value):
    path, _, arg = value.partition(':')
    text = os.path.splitext(os.path.basename(path))[0] + (f'-{arg}' if arg else '')
  else:
    text = str(value)
  return text.replace(':', '-').replace('/', '-').replace(' ', '').replace(',', '-')


def run_name(config: str, overrides: Mapping[str, Any], varied: Sequence[str]) -> str:
  """A readable, unique name from the swept values, e.g. 'mnist-super.num_heads=4'."""
  parts = [_short(config)] if 'config' in varied else []
  parts += [
    f'{key.split(".")[-1]}={_short(overrides[key])}'
    for key in varied
    if key != 'config' and key in overrides
  ]
  return '.'.join(parts) or _short(config)


def expand(sweep: Mapping[str, Any], root: str = '') -> List[Run]:
  """The runs of a sweep definition, in a stable order, with unique names."""
  known = {'config', 'grid', 'runs', 'fixed'}
  unknown = sorted(set(sweep) - known)
  if unknown:
    raise SweepError(f'unknown sweep keys {unknown}; valid keys: {sorted(known)}')
  grid = dict(sweep.get('grid', {}))
  fixed = dict(sweep.get('fixed', {}))
  points: List[Dict[str, Any]] = []
  if grid:
    keys = list(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
      points.append(dict(zip(keys, values)))
  points += [dict(r) for r in sweep.get('runs', [])]
  if not points:
    points = [{}]
  varied = []
  for p in points:
    for key in p:
      if key != 'name' and key not in varied and len({repr(q.get(key)) for q in points}) > 1:
        varied.append(key)
  fill = lambda v: v.replace('{root}', root) if isinstance(v, str) else v
  runs = []
  for p in points:
    config = p.pop('config', sweep.get('config'))
    if not config:
      raise SweepError("a sweep needs 'config' (top level or in the grid)")
    name = p.pop('name', None)
    overrides = {k: fill(v) for k, v in {**fixed, **p}.items()}
    runs.append(
      Run(
        name or run_name(config, {'config': config, **overrides}, varied), fill(config), overrides
      )
    )
  names = [r.name for r in runs]
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise SweepError(f'sweep has runs with the same name {dup}; vary fewer things or use `runs`')
  return runs


def workdir_of(run: Run, root: str) -> str:
  """The run's workdir under `root` (a local folder or gs://...)."""
  return os.fspath(epath.Path(root) / run.name) if root else run.name


def flag_args(run: Run, root: str) -> List[str]:
  """The main.py flags of one run."""
  return [f'--config={run.config}', f'--workdir={workdir_of(run, root)}'] + [
    f'--config.{k}={v}' for k, v in run.overrides.items()
  ]


def command(
  run: Run, root: str, python: str = sys.executable, extra: Sequence[str] = ()
) -> List[str]:
  """The main.py command line of one run."""
  return [python, 'main.py'] + flag_args(run, root) + list(extra)


def _parse_config(argv: Sequence[str]):
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values, sys_argv=argv)
  values(argv)
  return values.config


def build_config(run: Run):
  """The run's config, built from its config file and overrides exactly as main.py does.

  Raises SweepError with main.py's one-line message for each error, a line each:
  the config file's, or else every override's that fails (each is tried alone).
  """
  argv = ['main.py'] + [a for a in flag_args(run, '') if not a.startswith('--workdir')]
  try:
    return _parse_config(argv)
  except Exception as e:  # pylint: disable=broad-except  (flags errors, config file errors)
    together = pyfile.config_flag_error(e, argv)
  errors = []
  for one in [argv[:2]] + [argv[:2] + [override] for override in argv[2:]]:
    try:
      _parse_config(one)
    except Exception as e:  # pylint: disable=broad-except
      errors.append(pyfile.config_flag_error(e, one))
      if len(one) == 2:  # the config file itself: its overrides cannot be tried
        break
  raise SweepError('\n'.join(f'run {run.name!r}: {error}' for error in errors or [together]))

"""Expand a sweep into named runs; run them here one after another, or print pod commands.

A sweep file defines `get_sweep()` returning a dict with
  * `config`: the config file (big_vision style `path[:arg]`) — or put several
    under `grid['config']` to sweep datasets / experiments;
  * `grid`: {override or 'config': [values]}, expanded as a Cartesian product, and/or
  * `runs`: an explicit list of {override: value} dicts (each merged over `fixed`);
  * `fixed`: overrides applied to every run (e.g. {'train.num_steps': 500}).
Overrides are `ConfigDict` paths as on the command line (`attention.mechanism`).

    python -m train.sweep --sweep=sweeps/mnist_projections.py --root=runs/mnist list
    python -m train.sweep --sweep=sweeps/mnist_projections.py --root=runs/mnist run
    python -m train.sweep --sweep=sweeps/mnist_projections.py --root=runs/mnist pod \
        --tpu_name=my-v4-32 --zone=us-central2-b

`run` skips finished runs (their workdir has `results.json`) and resumes
unfinished ones (re-running the same command restores the latest checkpoint);
a failing run is reported and the sweep goes on. `pod` prints, for each run,
the one command that starts it on every worker of a TPU VM pod.
"""
import argparse
import dataclasses
import importlib.util
import itertools
import os
import shlex
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, Sequence

RESULTS_FILE = 'results.json'


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  config: str
  overrides: Mapping[str, Any]


def load_sweep(path: str) -> Dict[str, Any]:
  if not os.path.exists(path):
    raise FileNotFoundError(f'sweep file {path!r} does not exist')
  spec = importlib.util.spec_from_file_location('sweep_definition', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, 'get_sweep'):
    raise ValueError(f'sweep file {path!r} must define get_sweep()')
  return module.get_sweep()


def _short(value: Any) -> str:
  """'configs/cifar10.py:nystrom' -> 'cifar10-nystrom'; other values as text."""
  if isinstance(value, str) and (value.endswith('.py') or '.py:' in value):
    path, _, arg = value.partition(':')
    text = os.path.splitext(os.path.basename(path))[0] + (f'-{arg}' if arg else '')
  else:
    text = str(value)
  return text.replace(':', '-').replace('/', '-').replace(' ', '').replace(',', '-')


def run_name(config: str, overrides: Mapping[str, Any], varied: Sequence[str]) -> str:
  """A readable, unique name from the swept values, e.g. 'mnist_standard.mechanism=linear.num_heads=4'."""
  parts = [_short(config)] if 'config' in varied else []
  parts += [f'{key.split(".")[-1]}={_short(overrides[key])}' for key in varied
            if key != 'config' and key in overrides]
  return '.'.join(parts) or _short(config)


def expand(sweep: Mapping[str, Any]) -> List[Run]:
  """The runs of a sweep definition, in a stable order, with unique names."""
  known = {'config', 'grid', 'runs', 'fixed'}
  unknown = sorted(set(sweep) - known)
  if unknown:
    raise ValueError(f'unknown sweep keys {unknown}; valid keys: {sorted(known)}')
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
      if key not in varied and len({repr(q.get(key)) for q in points}) > 1:
        varied.append(key)
  runs = []
  for p in points:
    config = p.pop('config', sweep.get('config'))
    if not config:
      raise ValueError("a sweep needs 'config' (top level or in the grid)")
    overrides = {**fixed, **p}
    runs.append(Run(run_name(config, {'config': config, **overrides}, varied), config, overrides))
  names = [r.name for r in runs]
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise ValueError(f'sweep has runs with the same name {dup}; vary fewer things or use `runs`')
  return runs


def command(run: Run, root: str, python: str = sys.executable, extra: Sequence[str] = ()) -> List[str]:
  """The main.py command line of one run."""
  cmd = [python, 'main.py', f'--config={run.config}', f'--workdir={os.path.join(root, run.name)}']
  cmd += [f'--config.{k}={v}' for k, v in run.overrides.items()]
  return cmd + list(extra)


def status(run: Run, root: str) -> str:
  workdir = os.path.join(root, run.name)
  if os.path.exists(os.path.join(workdir, RESULTS_FILE)):
    return 'done'
  return 'partial' if os.path.isdir(workdir) else 'new'


def run_local(runs: Sequence[Run], root: str, python: str = sys.executable) -> Dict[str, str]:
  """Run each unfinished run in turn; returns {name: 'done'|'skipped'|'failed (rc=N)'}."""
  outcome = {}
  for i, run in enumerate(runs, 1):
    state = status(run, root)
    if state == 'done':
      print(f'[{i}/{len(runs)}] {run.name}: finished before, skipped', flush=True)
      outcome[run.name] = 'skipped'
      continue
    verb = 'resuming' if state == 'partial' else 'starting'
    print(f'[{i}/{len(runs)}] {run.name}: {verb}', flush=True)
    t0 = time.time()
    try:
      rc = subprocess.call(command(run, root, python))
    except OSError as e:  # the interpreter could not be started
      print(f'[{i}/{len(runs)}] {run.name}: could not start: {e}', flush=True)
      rc = -1
    took = time.time() - t0
    outcome[run.name] = 'done' if rc == 0 and status(run, root) == 'done' else f'failed (rc={rc})'
    print(f'[{i}/{len(runs)}] {run.name}: {outcome[run.name]} in {took:.0f}s', flush=True)
  return outcome


def pod_commands(runs: Sequence[Run], root: str, tpu_name: str, zone: str,
                 repo_dir: str = '~/efficient-attn') -> List[str]:
  """One `gcloud ... ssh --worker=all` command per run: every host starts the same
  program; main.py's no-argument `jax.distributed.initialize()` finds the pod."""
  out = []
  for run in runs:
    inner = ' '.join(shlex.quote(c) for c in command(run, root, python='python3'))
    remote = f'cd {repo_dir} && {inner}'
    out.append(f'gcloud compute tpus tpu-vm ssh {tpu_name} --zone={zone} --worker=all '
               f'--command={shlex.quote(remote)}')
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('action', choices=('list', 'run', 'pod'))
  parser.add_argument('--sweep', required=True, help='sweep definition file')
  parser.add_argument('--root', required=True, help='folder holding one workdir per run')
  parser.add_argument('--tpu_name', default='TPU_NAME')
  parser.add_argument('--zone', default='ZONE')
  parser.add_argument('--repo_dir', default='~/efficient-attn')
  args = parser.parse_args(argv)
  runs = expand(load_sweep(args.sweep))
  if args.action == 'list':
    for run in runs:
      print(f'{status(run, args.root):8s} {run.name}')
      print('         ' + ' '.join(shlex.quote(c) for c in command(run, args.root)))
    return 0
  if args.action == 'pod':
    print('\n'.join(pod_commands(runs, args.root, args.tpu_name, args.zone, args.repo_dir)))
    return 0
  outcome = run_local(runs, args.root)
  failed = [n for n, o in outcome.items() if o.startswith('failed')]
  print(f'{len(outcome) - len(failed)}/{len(outcome)} runs finished; results in {args.root}'
        + (f'; failed: {", ".join(failed)}' if failed else ''))
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())

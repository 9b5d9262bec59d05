"""The Long Range Arena's generated tasks, `small` size, every registered mechanism, one seed.

ListOps and Pathfinder need no download (generated once into
~/.cache/efficient_attn/lra). Each run has the same budget per task (the
config's `small` size). Then:

    python -m train.sweep --sweep=sweeps/lra_small.py --root=runs/lra run
    python -m benchmarks.lra_table runs/lra/* --out=docs/results --name=lra

TASKS (default "listops,pathfinder") and MECHANISMS (default: all) narrow it.
"""
import os

from efficient_attn import registry

TASKS = os.environ.get('TASKS', 'listops,pathfinder').split(',')
MECHANISMS = [m for m in os.environ.get('MECHANISMS', '').split(',') if m] or list(
    registry.list_mechanisms())


def get_sweep():
  return dict(runs=[{'name': f'{task}-{m}', 'config': f'configs/lra/{task}.py:{m},size=small'}
                    for task in TASKS for m in MECHANISMS])

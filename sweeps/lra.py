"""The Long Range Arena (Tay et al. 2021): every task x every registered mechanism, one seed.

    SIZE=small python -m train.sweep --sweep=sweeps/lra.py --root=runs/lra run     # a CPU
    AAN_DIR=gs://bucket/lra_release/tsv_data python -m train.sweep --sweep=sweeps/lra.py \
        --root=gs://bucket/lra pod --tpu_name=my-v4-32 --zone=us-central2-b        # LRA's sizes
    python -m benchmarks.lra_table 'runs/lra/*' --out=docs/results --name=lra

Environment:
  SIZE: 'base' (default: LRA's settings) or 'small' (minutes per run on one CPU core).
  TASKS: comma-separated; default listops, text, image, pathfinder, plus retrieval when
    AAN_DIR is set; with SIZE=small, listops and pathfinder (generated: no download).
  MECHANISMS: comma-separated (default: every registered mechanism).
  AAN_DIR: the folder of LRA's new_aan_pairs.{train,eval,test}.tsv (Retrieval).
"""
import os

from efficient_attn import registry
from train import env

SIZE = os.environ.get('SIZE', 'base')
AAN_DIR = os.environ.get('AAN_DIR', '')
DEFAULT_TASKS = ('listops,pathfinder' if SIZE == 'small' else
                 'listops,text,image,pathfinder' + (',retrieval' if AAN_DIR else ''))
TASKS = env.names('TASKS', DEFAULT_TASKS)
MECHANISMS = env.names('MECHANISMS', ','.join(registry.list_mechanisms()))


def get_sweep():
  runs = []
  for task in TASKS:
    for m in MECHANISMS:
      run = {'name': f'{task}-{m}', 'config': f'configs/lra/{task}.py:{m},size={SIZE}'}
      if task == 'retrieval':
        run['dataset.data_dir'] = AAN_DIR
      runs.append(run)
  return dict(runs=runs)

"""The Long Range Arena (Tay et al. 2021): every task x every registered mechanism, one seed.

    python -m train.sweep --sweep=sweeps/lra.py:size=small --root=runs/lra run     # a CPU
    python -m train.sweep --sweep=sweeps/lra.py:aan_dir=gs://bucket/lra_release/tsv_data \
        --root=gs://bucket/lra pod --tpu_name=my-v4-32 --zone=us-central2-b        # LRA's sizes
    python -m benchmarks.lra_table 'runs/lra/*' --out=docs/results --name=lra

Settings (key=value after ':'):
  size: 'base' (default: LRA's settings) or 'small' (minutes per run on one CPU core).
  tasks: default listops, text, image, pathfinder, plus retrieval when aan_dir is set;
    with size=small, listops and pathfinder (generated: no download).
  mechanisms: default every registered mechanism.
  aan_dir: the folder of LRA's new_aan_pairs.{train,eval,test}.tsv (Retrieval).
Lists run to the next key=value: `:size=small,tasks=listops,mechanisms=linear,softmax`.
"""

from configs import common
from efficient_attn import registry


def get_sweep(arg=None):
  args = common.parse_arg(
    arg, size='base', tasks=(), mechanisms=tuple(registry.list_mechanisms()), aan_dir=''
  )
  size, aan_dir = args['size'], args['aan_dir']
  tasks = args['tasks'] or (
    ('listops', 'pathfinder')
    if size == 'small'
    else ('listops', 'text', 'image', 'pathfinder') + (('retrieval',) if aan_dir else ())
  )
  runs = []
  for task in tasks:
    for m in args['mechanisms']:
      run = {'name': f'{task}-{m}', 'config': f'configs/lra/{task}.py:{m},size={size}'}
      if task == 'retrieval':
        run['dataset.data_dir'] = aan_dir
      runs.append(run)
  return dict(runs=runs)

"""The LoRA rank study of the "Efficient Attention" report on real MNIST (784-64-64-10 MLP).

Trained on 54,000 MNIST training images, validated on the 6,000 held out
(class-stratified). Settings (key=value after ':'): seed (default 0, the recorded
runs; the training seed of every run, base included), data_dir (the folder
holding mnist_train.npz, default ../shared/data).

    python -m train.sweep --sweep=studies/lora_mnist/sweep.py --root=runs/real/lora_mnist run
    python -m train.sweep --sweep=studies/lora_mnist/sweep.py:seed=1 \
        --root=runs/real/lora_mnist_seed1 run
    python -m benchmarks.lora_table --root=runs/real/lora_mnist,runs/real/lora_mnist_seed1 \
        --out=studies/lora_mnist --name=lora_mnist
"""

import os

from configs import common
from configs import lora_base


def get_sweep(arg=None):
  args = common.parse_arg(arg, seed=0, data_dir='../shared/data')
  common.at_least(0, seed=args['seed'])
  return dict(
    runs=lora_base.study_runs('mnist'),
    fixed={
      'train.seed': args['seed'],
      'dataset.source': 'arrays',
      'dataset.data_dir': os.path.join(args['data_dir'], 'mnist_train.npz'),
      'dataset.holdout': 0.1,
      'dataset.eval_split': 'validation',
    },
  )

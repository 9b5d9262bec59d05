"""Hosseini & Hosseini (2024) on real MNIST: the four projection schemes, two seeds each.

The ViT of configs/mnist.py (its model and optimiser; 15 epochs by default, not
10), trained on 54,000 MNIST training images and validated on the 6,000 held out
(class-stratified). Settings (key=value after ':'): seeds (default 0,1), so that
a second seed can run into its own root; schemes (default all four), so that the
study can be split across cores or machines; epochs (default 15; the study's
budget is 25); data_dir (the folder holding mnist_train.npz, default
../shared/data).

    python -m train.sweep \
        --sweep=studies/mnist_projections/sweep.py:schemes=super,seeds=1,epochs=25 \
        --root=runs/real/mnist25_seed1 run
"""

import os

from configs import common


def get_sweep(arg=None):
  args = common.parse_arg(
    arg,
    seeds=(0, 1),
    epochs=15,
    schemes=('standard', 'optimised', 'efficient', 'super'),
    data_dir='../shared/data',
  )
  common.at_least(0, seeds=args['seeds'])
  common.at_least(1, epochs=args['epochs'])
  return dict(
    grid={
      'train.seed': list(args['seeds']),  # every scheme's first seed before any second
      'config': [f'configs/mnist.py:{p}' for p in args['schemes']],
    },
    fixed={
      'train.num_epochs': args['epochs'],
      'dataset.source': 'arrays',
      'dataset.data_dir': os.path.join(args['data_dir'], 'mnist_train.npz'),
      'dataset.holdout': 0.1,
      'dataset.eval_split': 'validation',
    },
  )

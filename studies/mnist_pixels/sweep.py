"""Katharopoulos et al. (2020) on real MNIST: causal pixel models, linear against softmax.

784 pixel tokens per image, predicted in raster order. The model is the size
this 2-core CPU trains in about half an hour for softmax (d_model 64, 4 layers,
4 heads, MLP 256; the paper's is 256 / 8 / 8 / 1024 for 250 epochs), and both
mechanisms get the same budget: 500 steps of batch 32 (16,000 images, 0.30
epochs). The learning rate is 1e-3 for this short budget (the config's 1e-4 is
for 250 epochs). Trained on 54,000 MNIST training images; bits/dim on 6,000 held
out (class-stratified); the sample and completion PNGs are written at the end.

Settings (key=value after ':'): seed (default 0, the recorded runs), data_dir
(the folder holding mnist_train.npz, default ../shared/data).

    python -m train.sweep --sweep=studies/mnist_pixels/sweep.py:seed=1 \
        --root=runs/mnist_pixels_seed1 run
"""

import os

from configs import common


def get_sweep(arg=None):
  args = common.parse_arg(arg, seed=0, data_dir='../shared/data')
  common.at_least(0, seed=args['seed'])
  return dict(
    grid={'config': ['configs/mnist_pixels.py:linear', 'configs/mnist_pixels.py:softmax']},
    fixed={
      'model.d_model': 64,
      'model.depth': 4,
      'model.num_heads': 4,
      'model.mlp_dim': 256,
      'optim.learning_rate': 1e-3,
      'train.seed': args['seed'],
      'train.num_steps': 500,
      'train.log_every': 50,
      'train.checkpoint_every': 100,
      'dataset.source': 'arrays',
      'dataset.data_dir': os.path.join(args['data_dir'], 'mnist_train.npz'),
      'dataset.holdout': 0.1,
      'dataset.eval_split': 'validation',
    },
  )

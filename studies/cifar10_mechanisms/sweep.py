"""Attention mechanisms on real CIFAR-10: one small ViT per mechanism, equal budget.

The comparison of Ruda, Brazhniy & Korniienko ("Optimization of the Transformer's
attention") at configs/cifar10.py's size=small (d_model 64, 2 layers, 4 heads, MLP
128, 2x2 patches: 256 tokens, mean pooling; its optimiser and augmentation) for
exact softmax, linear (Katharopoulos et al. 2020), RFA (Peng et al. 2021),
Performer (Choromanski et al. 2021), Linformer (Wang et al. 2020), Nystrom (Xiong
et al. 2021) and local attention, each with its declared default options. Every
run has the same budget, `epochs` epochs of batch 128, the same seed and the same
data: 45,000 training images of cifar10_train_jpeg.npz and the 5,000 held out
(class-stratified) for validation.

Settings (key=value after ':'): seed (default 0, the recorded runs), epochs
(default 2), mechanisms (default all seven), data_dir (the folder holding the
file, default ../shared/data).

    python -m train.sweep --sweep=studies/cifar10_mechanisms/sweep.py:seed=1 \
        --root=runs/real/cifar10_seed1 run
"""

import os

from configs import common

MECHANISMS = ('softmax', 'linear', 'rfa', 'performer', 'linformer', 'nystrom', 'local')


def get_sweep(arg=None):
  args = common.parse_arg(arg, seed=0, epochs=2, mechanisms=MECHANISMS, data_dir='../shared/data')
  common.at_least(0, seed=args['seed'])
  common.at_least(1, epochs=args['epochs'])
  return dict(
    grid={'config': [f'configs/cifar10.py:mechanism={m},size=small' for m in args['mechanisms']]},
    fixed={
      'train.num_epochs': args['epochs'],
      'train.seed': args['seed'],
      'train.log_every': 50,
      'train.eval_every': 352,
      'train.checkpoint_every': 176,
      'dataset.source': 'arrays',
      'dataset.data_dir': os.path.join(args['data_dir'], 'cifar10_train_jpeg.npz'),
      'dataset.holdout': 0.1,
      'dataset.eval_split': 'validation',
    },
  )

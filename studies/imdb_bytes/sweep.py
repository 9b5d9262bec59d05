"""Byte-level IMDB on the real training reviews (the Long Range Arena's Text task, small model).

configs/lra/text.py at size=small (2 layers, width 64, 4 heads, MLP 128, fixed
sinusoidal positions, batch 32, its own 2,000 steps: 64,000 reviews, 2.8 epochs)
at 1,024 bytes per review, for linear attention (Katharopoulos et al. 2020),
Performer (Choromanski et al. 2021) and softmax attention, each on the same
budget. Trained on 22,500 of the 25,000 training reviews and validated on the
2,500 held out (class-stratified).

Settings (key=value after ':'): seed (default 0, the recorded runs), mechanisms
(default linear,performer,softmax), max_length (bytes per review, default 1024),
data_dir (the folder holding imdb_train.npz, default ../shared/data).

    python -m train.sweep --sweep=studies/imdb_bytes/sweep.py:seed=1,mechanisms=softmax \
        --root=runs/real/imdb_seed1_softmax run
"""

import os

from configs import common


def get_sweep(arg=None):
  args = common.parse_arg(
    arg,
    seed=0,
    mechanisms=('linear', 'performer', 'softmax'),
    max_length=1024,
    data_dir='../shared/data',
  )
  common.at_least(0, seed=args['seed'])
  common.at_least(1, max_length=args['max_length'])
  return dict(
    grid={
      'config': [
        f'configs/lra/text.py:mechanism={m},max_length={args["max_length"]},size=small'
        for m in args['mechanisms']
      ]
    },
    fixed={
      'train.seed': args['seed'],
      'train.log_every': 50,
      'train.eval_every': 500,
      'train.checkpoint_every': 250,
      'dataset.source': 'arrays',
      'dataset.data_dir': os.path.join(args['data_dir'], 'imdb_train.npz'),
      'dataset.holdout': 0.1,
      'dataset.eval_split': 'validation',
    },
  )

"""Byte-level IMDB on the real training reviews (the Long Range Arena's Text task, small model).

configs/lra/text.py at size=small (2 layers, width 64, 4 heads, MLP 128, fixed
sinusoidal positions, batch 32, its own 2,000 steps: 64,000 reviews, 2.8 epochs)
at 1,024 bytes per review, for linear attention (Katharopoulos et al. 2020),
Performer (Choromanski et al. 2021) and softmax attention, each on the same
budget. Trained on 22,500 of the
25,000 training reviews and validated on the 2,500 held out (class-stratified).
REAL_DATA_DIR points at the folder holding imdb_train.npz; MAX_LENGTH (default
1024) sets the bytes per review; MECHANISMS (comma-separated) picks the
mechanisms; SEED (default 0) the training seed.
"""
import os

from train import env

DATA = os.environ.get('REAL_DATA_DIR', '../shared/data')
MAX_LENGTH = env.integer('MAX_LENGTH', 1024, minimum=1)
MECHANISMS = env.names('MECHANISMS', 'linear,performer,softmax')
SEED = env.integer('SEED', 0)


def get_sweep():
  return dict(
      grid={'config': [f'configs/lra/text.py:mechanism={m},max_length={MAX_LENGTH},size=small'
                       for m in MECHANISMS]},
      fixed={'train.seed': SEED, 'train.log_every': 50, 'train.eval_every': 500,
             'train.checkpoint_every': 250,
             'dataset.source': 'arrays',
             'dataset.data_dir': os.path.join(DATA, 'imdb_train.npz'),
             'dataset.holdout': 0.1,
             'dataset.eval_split': 'validation'},
  )

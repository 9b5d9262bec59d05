"""Byte-level IMDB on the real training reviews (the Long Range Arena's Text task, small model).

configs/lra/text.py at size=small (2 layers, width 64, 4 heads, MLP 128, fixed
sinusoidal positions, batch 32) at 1,024 bytes per review, for softmax, linear
(Katharopoulos et al. 2020) and Performer (Choromanski et al. 2021), each on the
same budget: 500 steps (16,000 reviews, 0.7 epochs), which softmax trains in
about half an hour on one core of this CPU. Trained on 22,500 of the 25,000
training reviews and validated on the 2,500 held out (class-stratified).
REAL_DATA_DIR points at the folder holding imdb_train.npz; MAX_LENGTH (default
1024) sets the bytes per review.
"""
import os

DATA = os.environ.get('REAL_DATA_DIR', '../shared/data')
MAX_LENGTH = int(os.environ.get('MAX_LENGTH', '1024'))


def get_sweep():
  return dict(
      grid={'config': [f'configs/lra/text.py:mechanism={m},max_length={MAX_LENGTH},size=small'
                       for m in ('linear', 'performer', 'softmax')]},
      fixed={'train.num_steps': 500, 'train.log_every': 50, 'train.eval_every': 250,
             'train.checkpoint_every': 100,
             'dataset.source': 'arrays',
             'dataset.data_dir': os.path.join(DATA, 'imdb_train.npz'),
             'dataset.holdout': 0.1,
             'dataset.eval_split': 'validation'},
  )

"""Seed 000's comparison on real CIFAR-10: one small ViT per mechanism, equal budget.

configs/cifar10.py at size=small (d_model 64, 2 layers, 4 heads, MLP 128, 2x2
patches: 256 tokens, mean pooling; its optimiser and augmentation) for exact
softmax, linear (Katharopoulos et al. 2020), RFA (Peng et al. 2021), Performer
(Choromanski et al. 2021), Linformer (Wang et al. 2020), Nystrom (Xiong et al.
2021) and local attention, each with its declared default options. Every run has
the same budget, EPOCHS epochs of batch 128 (default 2), the same seed (SEED,
default 0) and the same data: 45,000 training images of cifar10_train_jpeg.npz
and the 5,000 held out (class-stratified) for validation. REAL_DATA_DIR points
at the folder holding the file; MECHANISMS (comma-separated) picks the
mechanisms.
"""
import os

from train import env

DATA = os.environ.get('REAL_DATA_DIR', '../shared/data')
EPOCHS = env.integer('EPOCHS', 2, minimum=1)
SEED = env.integer('SEED', 0)
MECHANISMS = env.names('MECHANISMS', 'softmax,linear,rfa,performer,linformer,nystrom,local')


def get_sweep():
  return dict(
      grid={'config': [f'configs/cifar10.py:mechanism={m},size=small' for m in MECHANISMS]},
      fixed={'train.num_epochs': EPOCHS, 'train.seed': SEED, 'train.log_every': 50,
             'train.eval_every': 352, 'train.checkpoint_every': 176,
             'dataset.source': 'arrays',
             'dataset.data_dir': os.path.join(DATA, 'cifar10_train_jpeg.npz'),
             'dataset.holdout': 0.1,
             'dataset.eval_split': 'validation'},
  )

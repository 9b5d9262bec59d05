"""Katharopoulos et al. (2020) on real MNIST: causal pixel models, linear against softmax.

784 pixel tokens per image, predicted in raster order. The model is the size
this 2-core CPU trains in about half an hour for softmax (d_model 64, 4 layers,
4 heads, MLP 256; the paper's is 256 / 8 / 8 / 1024 for 250 epochs), and both
mechanisms get the same budget: 500 steps of batch 32 (16,000 images, 0.30
epochs). The learning rate is 1e-3 for this short budget (the config's 1e-4 is
for 250 epochs). Trained on 54,000 MNIST training images; bits/dim on 6,000 held
out (class-stratified); the sample and completion PNGs are written at the end.
REAL_DATA_DIR points at the folder holding mnist_train.npz; SEED (default 0, the
recorded runs) the training seed.
"""
import os

from train import env

DATA = os.environ.get('REAL_DATA_DIR', '../shared/data')
SEED = env.integer('SEED', 0)


def get_sweep():
  return dict(
      grid={'config': ['configs/mnist_pixels.py:linear', 'configs/mnist_pixels.py:softmax']},
      fixed={'model.d_model': 64, 'model.depth': 4, 'model.num_heads': 4,
             'model.mlp_dim': 256,
             'optim.learning_rate': 1e-3,
             'train.seed': SEED, 'train.num_steps': 500, 'train.log_every': 50,
             'train.checkpoint_every': 100,
             'dataset.source': 'arrays',
             'dataset.data_dir': os.path.join(DATA, 'mnist_train.npz'),
             'dataset.holdout': 0.1,
             'dataset.eval_split': 'validation'},
  )

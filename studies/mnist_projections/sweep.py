"""Hosseini & Hosseini (2024) on real MNIST: the four projection schemes, two seeds each.

The ViT of configs/mnist.py (its model and optimiser; 15 epochs, not 10), trained
on 54,000 MNIST training images and validated on the 6,000 held out
(class-stratified). REAL_DATA_DIR points at the folder holding mnist_train.npz;
SEEDS (default "0,1") picks the seeds, so a second seed can run into its own root;
SCHEMES (default all four) picks the projection schemes, so the study can be split
across cores or machines; EPOCHS (default 15, the budget of
docs/results/real_data.md's runs) sets the budget.
"""
import os

from train import env

DATA = os.environ.get('REAL_DATA_DIR', '../shared/data')
SEEDS = env.integers('SEEDS', '0,1')
EPOCHS = env.integer('EPOCHS', 15, minimum=1)
SCHEMES = env.names('SCHEMES', 'standard,optimised,efficient,super')


def get_sweep():
  return dict(
      grid={'train.seed': SEEDS,  # every scheme's first seed before any second seed
            'config': [f'configs/mnist.py:{p}' for p in SCHEMES]},
      fixed={'train.num_epochs': EPOCHS,
             'dataset.source': 'arrays',
             'dataset.data_dir': os.path.join(DATA, 'mnist_train.npz'),
             'dataset.holdout': 0.1,
             'dataset.eval_split': 'validation'},
  )

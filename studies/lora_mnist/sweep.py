"""The LoRA rank study of the "Efficient Attention" report on real MNIST (784-64-64-10 MLP).

Trained on 54,000 MNIST training images, validated on the 6,000 held out
(class-stratified). REAL_DATA_DIR points at the folder holding mnist_train.npz;
SEED (default 0, the recorded runs) the training seed of every run, base included.

    python -m train.sweep --sweep=sweeps/real/lora_mnist.py --root=runs/real/lora_mnist run
    SEED=1 python -m train.sweep --sweep=sweeps/real/lora_mnist.py \
        --root=runs/real/lora_mnist_seed1 run
    python -m benchmarks.lora_table --root=runs/real/lora_mnist,runs/real/lora_mnist_seed1 \
        --out=docs/results --name=lora_mnist
"""
import os

from configs import lora_base
from train import env

DATA = os.environ.get('REAL_DATA_DIR', '../shared/data')
SEED = env.integer('SEED', 0)


def get_sweep():
  return dict(
      runs=lora_base.study_runs('mnist'),
      fixed={'train.seed': SEED,
             'dataset.source': 'arrays',
             'dataset.data_dir': os.path.join(DATA, 'mnist_train.npz'),
             'dataset.holdout': 0.1,
             'dataset.eval_split': 'validation'},
  )

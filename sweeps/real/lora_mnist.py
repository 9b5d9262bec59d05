"""The LoRA rank study of the "Efficient Attention" report on real MNIST (784-64-64-10 MLP).

Trained on 54,000 MNIST training images, validated on the 6,000 held out
(class-stratified). REAL_DATA_DIR points at the folder holding mnist_train.npz.

    python -m train.sweep --sweep=sweeps/real/lora_mnist.py --root=runs/real/lora_mnist run
    python -m benchmarks.lora_table --root=runs/real/lora_mnist --out=docs/results/lora_mnist
"""
import os

from configs import lora_base

DATA = os.environ.get('REAL_DATA_DIR', '../shared/data')


def get_sweep():
  return dict(
      runs=lora_base.study_runs('mnist'),
      fixed={'dataset.source': 'arrays',
             'dataset.data_dir': os.path.join(DATA, 'mnist_train.npz'),
             'dataset.holdout': 0.1,
             'dataset.eval_split': 'validation'},
  )

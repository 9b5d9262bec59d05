"""Every registered mechanism on CIFAR-10 with the same ViT (configs/cifar10.py's base size).

Each run is exactly what `--config=configs/cifar10.py:<mechanism>` runs, the
mechanism's declared options included (`tests/train/test_sweep.py` checks it). The
recorded study on real CIFAR-10 (seven mechanisms, size=small, equal budget) is
`studies/cifar10_mechanisms/`.
"""

from efficient_attn import registry


def get_sweep():
  return dict(grid={'config': [f'configs/cifar10.py:{m}' for m in registry.list_mechanisms()]})

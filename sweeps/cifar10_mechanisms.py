"""Every registered mechanism on CIFAR-10 with the same ViT.

Each run is exactly what `--config=configs/cifar10.py:<mechanism>` runs, the
mechanism's declared options included (`tests/test_sweep.py` checks it).
"""
from efficient_attn import registry


def get_sweep():
  return dict(grid={'config': [f'configs/cifar10.py:{m}' for m in registry.list_mechanisms()]})

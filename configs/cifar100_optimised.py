"""CIFAR-100 ViT (paper 004) with the optimised projection scheme; see configs/cifar100.py."""
from configs import cifar100


def get_config():
  return cifar100.get_config('optimised')

"""CIFAR-10 ViT with performer attention; see configs/cifar10.py."""
from configs import cifar10


def get_config():
  return cifar10.get_config('performer')

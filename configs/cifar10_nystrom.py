"""CIFAR-10 ViT with Nystrom attention (Xiong et al. 2021); see configs/cifar10.py."""

from configs import cifar10


def get_config():
  return cifar10.get_config('nystrom')

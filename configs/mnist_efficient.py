"""MNIST ViT (paper 004) with the efficient projection scheme; see configs/mnist.py."""
from configs import mnist


def get_config():
  return mnist.get_config('efficient')

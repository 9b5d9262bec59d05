"""MNIST pixel model with linear attention; see configs/mnist_pixels.py."""
from configs import mnist_pixels


def get_config():
  return mnist_pixels.get_config('linear')

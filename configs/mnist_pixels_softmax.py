"""MNIST pixel model with softmax attention; see configs/mnist_pixels.py."""
from configs import mnist_pixels


def get_config():
  return mnist_pixels.get_config('softmax')

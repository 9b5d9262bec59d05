"""Reduced ViT-B/16 on ImageNet (paper 004), super projection; see configs/imagenet.py."""
from configs import imagenet


def get_config():
  return imagenet.get_config('super')

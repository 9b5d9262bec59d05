"""Digits pixel model with softmax attention (KV cache to sample); see configs/digits_pixels.py."""
from configs import digits_pixels


def get_config():
  return digits_pixels.get_config('softmax')

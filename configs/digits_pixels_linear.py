"""Digits pixel model with linear attention (an RNN when sampling); see configs/digits_pixels.py."""
from configs import digits_pixels


def get_config():
  return digits_pixels.get_config('linear')

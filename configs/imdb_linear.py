"""Byte-level IMDB classification with linear attention; see configs/imdb.py."""
from configs import imdb


def get_config():
  return imdb.get_config('linear')

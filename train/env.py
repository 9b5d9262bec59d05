"""Settings read from environment variables (sweep files), with one-line errors.

    SEED = env.integer('SEED', 0)
    MECHANISMS = env.names('MECHANISMS', 'softmax,linear')

A value that cannot be used raises a ValueError naming the variable, its value
and what it must be.
"""
import os
from typing import List


def integer(name: str, default: int, minimum: int = 0) -> int:
  """`$name` as an integer >= minimum, or `default` when unset or empty."""
  text = os.environ.get(name, '').strip()
  if not text:
    return default
  try:
    value = int(text)
  except ValueError:
    raise ValueError(f'{name}={text!r} is not an integer') from None
  if value < minimum:
    raise ValueError(f'{name}={value} is not valid; it must be >= {minimum}')
  return value


def integers(name: str, default: str, minimum: int = 0) -> List[int]:
  """`$name` as comma-separated integers >= minimum (`default` when unset or empty)."""
  items = names(name, default)
  try:
    values = [int(t) for t in items]
  except ValueError:
    raise ValueError(f'{name}={",".join(items)!r} is not a comma-separated list of '
                     f'integers') from None
  bad = [v for v in values if v < minimum]
  if bad:
    raise ValueError(f'{name}: {bad[0]} is not valid; every value must be >= {minimum}')
  return values


def names(name: str, default: str) -> List[str]:
  """`$name` split at commas, blanks dropped (`default` when unset or empty)."""
  items = [t.strip() for t in (os.environ.get(name, '').strip() or default).split(',')]
  items = [t for t in items if t]
  if not items:
    raise ValueError(f'{name} names nothing; give a comma-separated list')
  return items

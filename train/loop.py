"""The training loop's settings: what `config.train` accepts, resolved once.

    loop = loop.check(config)   # ConfigError for the first bad field; else the Loop
    loop.log_every, loop.eval_every, loop.seed, ...

The trainer (`train/trainer.py`) runs the loop these settings describe; `check`
is the loop's part of `train.validate`, declared as a `fields.Field` table
like the other concerns' checks.
"""

import dataclasses
from typing import Dict

from configs import fields
from train import mesh as mesh_lib
from train import modeling

FIELDS = (  # what `config.train` accepts, field by field (the rules between fields: check)
  *(
    fields.Field(f'train.{name}', above=0, integer=True)
    for name in ('log_every', 'checkpoint_every', 'keep_checkpoints')
  ),
  # the model's and the data's seed: jax.random.key takes a 64-bit signed int, the data's
  # numpy generators a non-negative one (-1 failed after config.json was written)
  fields.Field('train.seed', minimum=0, below=2**63, integer=True),
  fields.Field('train.dtype', choices=tuple(modeling.DTYPES)),
  fields.Field(
    'train.fsdp_min_size',
    minimum=0,
    integer=True,
    default=mesh_lib.FSDP_MIN_SIZE,
    note='(elements; smaller leaves stay replicated)',
  ),
)


@dataclasses.dataclass(frozen=True)
class Loop:
  """`config.train`, checked: how long the loop runs, how often it reports, evaluates and
  saves, its seed, and the device mesh it runs on (`mesh`: `config.train.mesh` with every
  axis named, -1 unresolved; see `train/mesh.py`). `num_steps > 0` takes precedence over
  `num_epochs`; `eval_every` -1: only at the end."""

  num_steps: int
  num_epochs: int
  eval_every: int
  log_every: int
  checkpoint_every: int
  keep_checkpoints: int
  async_checkpoints: bool
  seed: int
  dtype: str
  mesh: Dict[str, int] = dataclasses.field(default_factory=lambda: dict(mesh_lib.DEFAULTS))
  fsdp_min_size: int = mesh_lib.FSDP_MIN_SIZE


def check(config) -> Loop:
  """ConfigError (`fields.ConfigError`) for the first invalid field of `config.train`; else
  its `Loop`."""
  settings = config.train
  if settings.num_steps <= 0 and settings.num_epochs <= 0:  # num_steps > 0 wins over num_epochs
    raise fields.ConfigError(
      f'config.train.num_steps={settings.num_steps} and config.train.'
      f'num_epochs={settings.num_epochs}: set one of them > 0 (num_steps '
      f'takes precedence)'
    )
  if settings.eval_every == 0 or settings.eval_every < -1:
    raise fields.ConfigError(
      f'config.train.eval_every={settings.eval_every} is not valid; it must '
      f'be > 0, or -1 for only at the end'
    )
  fields.check(config, FIELDS)
  try:
    mesh = mesh_lib.check_spec(settings.get('mesh'))
  except ValueError as e:
    raise fields.ConfigError(str(e)) from None
  return Loop(
    num_steps=settings.num_steps,
    num_epochs=settings.num_epochs,
    eval_every=settings.eval_every,
    log_every=settings.log_every,
    checkpoint_every=settings.checkpoint_every,
    keep_checkpoints=settings.keep_checkpoints,
    async_checkpoints=settings.get('async_checkpoints', True),
    seed=settings.seed,
    dtype=settings.dtype,
    mesh=mesh,
    fsdp_min_size=settings.get('fsdp_min_size', mesh_lib.FSDP_MIN_SIZE),
  )

"""Config fields declared once, as the mechanisms declare their options.

Each concern (the data package, and the trainer's model, attention, optimiser,
adapters and training loop) owns the fields it reads and checks them in its own
`check(config)`, from a small table of `Field`s (choices, bounds) plus the few
rules a table cannot say; `train.validate` runs those checks in turn. This
module is the config's schema, so it lives with the configs; it imports nothing of
the project, and it is the one module of `configs/` that `data/` may import, so
`data/` and `train/` declare their fields the same way.

    FIELDS = (fields.Field('optim.name', choices=OPTIMIZERS),
              fields.Field('optim.learning_rate', above=0),
              fields.Field('optim.b1', minimum=0.0, below=1.0))
    fields.check(config, FIELDS)

Every error is one line naming the field, the bad value and what is valid, e.g.
"config.optim.b1=1.5 is not valid; it must be in [0, 1)". A bounded field holds a
finite number: NaN and infinities are refused ("config.optim.learning_rate=nan is not
valid; it must be a finite number > 0") unless the field sets `allow_inf`; an
`integer` field (a seed, a count) holds an int.
"""

import dataclasses
import math
import numbers
from typing import Any, Callable, Iterable, Optional, Tuple


class ConfigError(ValueError):
  """A config field holds a value the experiment cannot run with."""


class _Missing:
  def __repr__(self):
    return 'MISSING'


MISSING = _Missing()  # a Field's default: the field is required


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field and what it accepts.

  Attributes:
    path: the field under `config`, e.g. 'optim.learning_rate'.
    choices: the allowed values.
    above: exclusive lower bound (a number is required), e.g. 0 for "> 0".
    minimum: inclusive lower bound.
    below: exclusive upper bound (with `minimum`: "in [minimum, below)").
    note: said after the rule, e.g. '(0 = none)'.
    integer: the value must be an integer (a seed, a count), not a float or a bool.
    allow_inf: a bounded field refuses NaN and infinities unless this is set (then
      infinities within the bounds pass; NaN never does).
    default: the value of a field the config may leave out (MISSING: required).
    when: (path, test): the field is checked only when `test` holds for the value of the
      field at `path` (None if the config leaves it out), e.g. a ViT's patch size:
      `when=('model.kind', lambda kind: kind == 'vit')`.
  """

  path: str
  choices: Tuple[Any, ...] = ()
  above: Optional[float] = None
  minimum: Optional[float] = None
  below: Optional[float] = None
  note: str = ''
  default: Any = MISSING
  when: Optional[Tuple[str, Callable[[Any], bool]]] = None
  integer: bool = False
  allow_inf: bool = False

  def value(self, config) -> Any:
    value = config
    for part in self.path.split('.'):
      if self.default is not MISSING and (value is None or part not in value):
        return self.default
      value = value[part]
    return value

  def describe(self, value: Any = MISSING) -> str:
    """What the field accepts: 'it must be > 0', 'it must be in [0, 1)', ...; 'an integer'
    or 'a finite number' said too when `value` is not one."""
    if self.minimum is not None and self.below is not None:
      rule = f'in [{_number_text(self.minimum)}, {_number_text(self.below)})'
    elif self.above is not None:
      rule = f'> {_number_text(self.above)}'
    elif self.minimum is not None:
      rule = f'>= {_number_text(self.minimum)}'
    else:
      rule = ''
    kind = (
      'an integer'
      if self.integer
      else ''
      if value is MISSING or self._number(value)
      else 'a number (not NaN)'
      if self.allow_inf
      else 'a finite number'
    )
    return f'it must be {" ".join(filter(None, (kind, rule)))}' + (
      f' {self.note}' if self.note else ''
    )

  def _number(self, value: Any) -> bool:
    """Whether `value` is a number this field may hold, bounds aside: finite (unless
    `allow_inf`; NaN never), and an integer if `integer`."""
    if self.integer:
      return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not isinstance(value, numbers.Real) or math.isnan(value):
      return False
    return self.allow_inf or math.isfinite(value)

  def check(self, config) -> None:
    """ConfigError naming the field, its value and what is valid."""
    value = self.value(config)
    if self.choices:
      if value not in self.choices:
        raise ConfigError(
          f'config.{self.path}={value!r} is not valid; valid choices: '
          f'{", ".join(map(str, self.choices))}'
        )
      return
    bounded = (self.above, self.minimum, self.below) != (None, None, None)
    bad = ((bounded or self.integer) and not self._number(value)) or (
      (self.above is not None and value <= self.above)
      or (self.minimum is not None and value < self.minimum)
      or (self.below is not None and value >= self.below)
    )
    if bad:
      raise ConfigError(f'config.{self.path}={value!r} is not valid; {self.describe(value)}')

  def applies(self, config) -> bool:
    """Whether `config` asks for this field to be checked (see `when`)."""
    if self.when is None:
      return True
    path, test = self.when
    return test(Field(path, default=None).value(config))


def _number_text(bound: float) -> str:
  """A bound as a message says it: an integer in full, a float as '%g' (0.0 as '0')."""
  return str(bound) if isinstance(bound, numbers.Integral) else f'{bound:g}'


def check(config, table: Iterable[Field]) -> None:
  """Checks each field of `table` in order (those that apply); the first bad one raises
  ConfigError."""
  for field in table:
    if field.applies(config):
      field.check(config)


def is_local(path) -> bool:
  """Whether the path a field names is on this machine's filesystem (not gs://, s3://, ...)."""
  return '://' not in str(path)

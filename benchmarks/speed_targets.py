"""benchmarks.speed's targets: what to measure ('exact', mechanisms, 'mechanism/projection'
layers, each with its own options 'mechanism@option=value'), and at which lengths."""

from typing import Any, Dict, List, Sequence, Tuple

from benchmarks import attention_bench
from benchmarks import common


def split_target(target: str) -> Tuple[str, Dict[str, Any]]:
  """'gla@form=naive@chunk_size=32' -> ('gla', {'form': 'naive', 'chunk_size': 32}).

  Raises ValueError for an unknown mechanism or projection, or an option the
  mechanism does not have or refuses.
  """
  base, *items = target.split('@')
  mechanism, _ = attention_bench.parse_target(base)
  if items and mechanism == attention_bench.EXACT:
    raise ValueError(f"'{attention_bench.EXACT}' takes no options: {target!r}")
  overrides = {}
  for item in items:
    option, sep, value = item.partition('=')
    if not sep:
      raise ValueError(f'{target!r}: {item!r} must look like option=value')
    overrides[option] = common.parse_value(value)
  attention_bench.effective_options(mechanism, overrides)  # ValueError for a bad option or value
  return base, overrides


def select_targets(args) -> List[str]:
  """What to measure, from --mechanisms or --targets, and --layers (see
  benchmarks.speed's docstring). Raises ValueError naming the flag for a bad name, a layer
  in --mechanisms, or --mechanisms and --targets that name different lists."""
  mechanisms = common.csv_list(args.mechanisms) if args.mechanisms else []
  targets = common.csv_list(args.targets) if args.targets else []
  if mechanisms and targets and mechanisms != targets:
    raise ValueError(
      f'--mechanisms={args.mechanisms!r} and --targets={args.targets!r} '
      'name different lists; give one (--mechanisms: exact and mechanisms; '
      "--targets: also layers 'mechanism/projection')"
    )
  flag = '--mechanisms' if mechanisms else '--targets'
  chosen = mechanisms or targets
  for t in chosen:
    if '/' in t.split('@')[0] and flag == '--mechanisms':
      raise ValueError(
        f"--mechanisms={args.mechanisms!r} is not valid: {t!r} is a layer "
        "'mechanism/projection'; valid: exact and mechanisms (layers go in "
        '--layers or --targets)'
      )
  out = chosen or [attention_bench.EXACT] + list(attention_bench.available_mechanisms())
  layers = common.csv_list(args.layers) if args['layers'].present or not chosen else []
  out = list(dict.fromkeys(out + layers))  # in order, once each
  for t in out:
    try:
      split_target(t)
    except ValueError as e:
      raise ValueError(f'{flag} / --layers: {e}') from None
  return out


def positive_lengths(text: str, flag: str) -> List[int]:
  """'256,1024' -> [256, 1024]; ValueError naming `flag` for an item that is not a
  positive integer (a length 0 would time an empty problem)."""
  lengths = common.csv_list(text, int, flag)
  for n in lengths:
    if n < 1:
      raise ValueError(
        f'{flag}={text!r} is not valid: {n} is not a positive integer; '
        'valid: a comma list of positive integers'
      )
  return lengths


def target_lengths(args, target: str, lengths: Sequence[int]) -> List[int]:
  extra = []
  for item in args.extra_lengths:
    name, _, values = item.partition('=')
    if name == target:
      extra += common.csv_list(values, int)
  return sorted(set(lengths) | set(extra))

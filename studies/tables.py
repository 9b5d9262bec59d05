"""The studies' results tables, generated from each study's own JSON files.

Each study folder has a `results.py` whose `table()` returns its results table in markdown,
read from the study's JSON (no training, no model). The study's README holds that table
between the markers `<!-- results:start -->` and `<!-- results:end -->`. The index,
studies/README.md, holds a row per study from each `results.py`'s `QUESTION`, `BUDGET` and
`headline()`. A test (tests/project/test_doc_numbers.py) fails when a README's table differs from
what the JSON gives.

    python -m studies.tables                                    # check: exit 1 naming the stale
    python -m studies.tables --update=studies/recall/README.md  # rewrite one table in place
    python -m studies.tables --update=all                       # rewrite every one

The repository's README.md holds a shorter table between the same markers: a row per
study with its budget and headline (`front`).

The helpers below format numbers the same way in every study.
"""

import argparse
import glob
import importlib
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = '<!-- results:start -->', '<!-- results:end -->'
INDEX = 'studies/README.md'
FRONT = 'README.md'  # the repository's front page: one row per study, linking to it


def load(path: str) -> Any:
  """A JSON file, its path relative to the repository root."""
  with open(os.path.join(ROOT, path)) as f:
    return json.load(f)


def pct(x: Optional[float], digits: int = 2) -> str:
  """0.99975 -> '99.98%' (None -> '-')."""
  return '-' if x is None else f'{100 * x:.{digits}f}%'


def mean_spread(values: Sequence[float]) -> Tuple[float, float]:
  """The mean and half the range."""
  return sum(values) / len(values), (max(values) - min(values)) / 2


def pct_spread(values: Sequence[float], digits: int = 2) -> str:
  """Seed values -> '99.98 ± 0.01%' (the mean ± half the range; one value: its own)."""
  if len(values) == 1:
    return pct(values[0], digits)
  mean, spread = mean_spread(values)
  return f'{100 * mean:.{digits}f} ± {100 * spread:.{digits}f}%'


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = '') -> str:
  """A markdown table; `align` is one 'l' or 'r' per column (default: first left, rest right)."""
  align = align or 'l' + 'r' * (len(header) - 1)
  lines = [
    '| ' + ' | '.join(header) + ' |',
    '|' + '|'.join(':---' if a == 'l' else '---:' for a in align) + '|',
  ]
  lines += ['| ' + ' | '.join('-' if c is None else str(c) for c in row) + ' |' for row in rows]
  return '\n'.join(lines)


def studies() -> List[str]:
  """The study folders that have a results.py, e.g. ['bytelm', ...]."""
  return sorted(
    os.path.basename(os.path.dirname(p))
    for p in glob.glob(os.path.join(ROOT, 'studies', '*', 'results.py'))
  )


def module(study: str):
  return importlib.import_module(f'studies.{study}.results')


def index() -> str:
  """studies/README.md's table: a row per study."""
  rows = []
  for study in studies():
    results = module(study)
    rows.append(
      [f'[{study}]({study}/README.md)', results.QUESTION, results.BUDGET, results.headline()]
    )
  return md_table(
    ['study', 'question', 'budget', 'headline (validation or test, mean of the seeds)'],
    rows,
    'llll',
  )


def front() -> str:
  """README.md's results table: a row per study (its budget and headline), linking to it."""
  rows = [
    [f'[{s}](studies/{s}/README.md)', module(s).BUDGET, module(s).headline()] for s in studies()
  ]
  return md_table(
    ['study', 'budget', 'headline (validation or test, mean of the seeds)'], rows, 'lll'
  )


def readmes() -> Dict[str, str]:
  """{README path relative to the root: the function that gives its table}."""
  found = {f'studies/{s}/README.md': module(s).table for s in studies()}
  found[INDEX] = index
  found[FRONT] = front
  return found


def current(text: str, path: str = 'the file') -> str:
  """The table between the markers of `text`."""
  if START not in text or END not in text:
    raise ValueError(f'{path} has no {START} ... {END} markers')
  return text.split(START, 1)[1].split(END, 1)[0].strip('\n')


def update(path: str, table: str) -> bool:
  """Rewrites the table between the markers of `path` (relative to the root); returns
  whether it changed."""
  full = os.path.join(ROOT, path)
  with open(full) as f:
    text = f.read()
  current(text, path)
  head, rest = text.split(START, 1)
  new = f'{head}{START}\n{table}\n{END}{rest.split(END, 1)[1]}'
  if new != text:
    with open(full, 'w') as f:
      f.write(new)
  return new != text


def stale() -> List[str]:
  """The READMEs whose table is not what their JSON gives."""
  found = []
  for path, table in readmes().items():
    with open(os.path.join(ROOT, path)) as f:
      if current(f.read(), path) != table():
        found.append(path)
  return found


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    '--update', default='', help='a study README (or "all") whose table to rewrite in place'
  )
  args = parser.parse_args(argv)
  tables = readmes()
  if args.update:
    chosen = (
      list(tables)
      if args.update == 'all'
      else [os.path.relpath(os.path.abspath(args.update), ROOT)]
    )
    unknown = [p for p in chosen if p not in tables]
    if unknown:
      print(
        f'--update: {", ".join(unknown)} is no study README; valid: all, {", ".join(tables)}',
        file=sys.stderr,
      )
      return 1
    for path in chosen:
      print(f'{path}: {"updated" if update(path, tables[path]()) else "already current"}')
    return 0
  found = stale()
  for path in found:
    print(f'{path}: its results table is stale: run python -m studies.tables --update={path}')
  return 1 if found else 0


if __name__ == '__main__':
  sys.exit(main())

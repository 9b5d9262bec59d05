"""The suite's time per test file, from a `pytest --durations=0` log, as a Markdown table.

    .venv/bin/python -m pytest -n 2 tests --durations=0 | tee /tmp/profile.log
    .venv/bin/python tests/profile_table.py /tmp/profile.log [--slowest=15]

Sums each file's setup, call and teardown durations (seconds of wall time in the
worker that ran them; with `-n 2` two workers run at once, so the sum is about
twice the suite's wall time), and lists the slowest single durations.
"""

import argparse
import collections
import re
import sys

LINE = re.compile(r'^([0-9.]+)s (setup|call|teardown) +(\S+?\.py)(::\S.*)?$')


def parse(lines):
  """[(seconds, phase, file, test)] of the durations lines."""
  rows = []
  for line in lines:
    m = LINE.match(line.strip())
    if m:
      rows.append((float(m.group(1)), m.group(2), m.group(3), (m.group(4) or '')[2:]))
  return rows


def table(rows, slowest=15):
  per_file = collections.defaultdict(lambda: [0.0, set()])
  for seconds, _, path, test in rows:
    per_file[path][0] += seconds
    per_file[path][1].add(test)
  total = sum(s for s, _ in per_file.values())
  out = ['| file | tests timed | seconds | share |', '|---|---:|---:|---:|']
  for path, (seconds, tests) in sorted(per_file.items(), key=lambda kv: -kv[1][0]):
    out.append(f'| {path} | {len(tests)} | {seconds:.1f} | {100 * seconds / total:.1f}% |')
  out.append(f'| all | {sum(len(t) for _, t in per_file.values())} | {total:.1f} | 100% |')
  out += ['', '| seconds | phase | test |', '|---:|---|---|']
  for seconds, phase, path, test in sorted(rows, reverse=True)[:slowest]:
    out.append(f'| {seconds:.1f} | {phase} | {path}::{test} |')
  return '\n'.join(out)


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('log')
  parser.add_argument('--slowest', type=int, default=15)
  args = parser.parse_args(argv)
  with open(args.log) as f:
    rows = parse(f)
  if not rows:
    sys.exit(f'{args.log} has no durations lines: run pytest with --durations=0')
  print(table(rows, args.slowest))


if __name__ == '__main__':
  main(sys.argv[1:])

"""A pytest plugin: JAX's tracing, lowering and compile time and count, per test.

    PYTHONPATH=tests .venv/bin/python -m pytest -p compile_counts tests/layers/test_packed.py
    .venv/bin/python tests/compile_counts.py compile_counts_*.json   # the table

Each process writes `compile_counts_<worker>.json` (or under `$COMPILE_COUNTS_OUT`):
{test id: {'seconds': {event: s}, 'count': {event: n}}}, with 'wall' for the whole test.
The number of compiles does not change with the machine's load, unlike seconds: a test
with hundreds runs op by op somewhere (docs/testing.md).
"""

import collections
import json
import os
import sys
import time

import pytest

COMPILE = '/jax/core/compile/backend_compile_duration'
_current = ['<outside tests>']
_seconds = collections.defaultdict(collections.Counter)
_counts = collections.defaultdict(collections.Counter)


def _listen(event: str, duration: float, **_):
  _seconds[_current[0]][event] += duration
  _counts[_current[0]][event] += 1


def pytest_configure(config):
  del config
  import jax  # pylint: disable=g-import-not-at-top

  jax.monitoring.register_event_duration_secs_listener(_listen)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  _current[0] = item.nodeid
  start = time.perf_counter()
  yield
  _seconds[item.nodeid]['wall'] += time.perf_counter() - start
  _current[0] = '<outside tests>'


def pytest_sessionfinish(session):
  del session
  worker = os.environ.get('PYTEST_XDIST_WORKER', 'main')
  path = os.path.join(os.environ.get('COMPILE_COUNTS_OUT', '.'), f'compile_counts_{worker}.json')
  tests = {k: {'seconds': dict(_seconds[k]), 'count': dict(_counts[k])} for k in _seconds}
  with open(path, 'w') as f:
    json.dump(tests, f)


def main(paths) -> None:
  """Prints the tests with the most compiles: count, compile and wall seconds, test id."""
  rows = []
  for path in paths:
    with open(path) as f:
      for test, record in json.load(f).items():
        seconds = record['seconds']
        rows.append(
          (
            record['count'].get(COMPILE, 0),
            seconds.get(COMPILE, 0.0),
            seconds.get('wall', 0.0),
            test,
          )
        )
  rows.sort(reverse=True)
  print(f'{"compiles":>8} {"compile s":>9} {"wall s":>7}  test')
  for count, compile_s, wall, test in rows[:40]:
    print(f'{count:8d} {compile_s:9.1f} {wall:7.1f}  {test}')
  total = [sum(row[i] for row in rows) for i in range(3)]
  print(f'{total[0]:8d} {total[1]:9.1f} {total[2]:7.1f}  all')


if __name__ == '__main__':
  main(sys.argv[1:])

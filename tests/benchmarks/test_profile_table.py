"""tests/profile_table.py: a --durations log summed per file, and a log without durations."""

import profile_table
import pytest

LOG = '''\
============================= slowest durations ==============================
12.50s call     tests/test_a.py::test_one[x-1]
2.50s setup    tests/test_a.py::test_one[x-1]
5.00s call     tests/test_b.py::test_two
1.00s call     tests/test_a.py::test_three
(3 durations < 0.005s hidden.  Use -vv to show these durations.)
'''


def test_sums_each_file_and_lists_the_slowest():
  text = profile_table.table(profile_table.parse(LOG.splitlines()), slowest=2)
  assert '| tests/test_a.py | 2 | 16.0 | 76.2% |' in text
  assert '| tests/test_b.py | 1 | 5.0 | 23.8% |' in text
  assert '| all | 3 | 21.0 | 100% |' in text
  assert text.index('tests/test_a.py |') < text.index('tests/test_b.py |')  # slowest first
  assert text.endswith(
    '| 12.5 | call | tests/test_a.py::test_one[x-1] |\n| 5.0 | call | tests/test_b.py::test_two |'
  )


def test_a_log_without_durations_is_named(tmp_path):
  path = tmp_path / 'log'
  path.write_text('807 passed in 10.0s\n')
  with pytest.raises(SystemExit, match=f'{path} has no durations lines'):
    profile_table.main([str(path)])

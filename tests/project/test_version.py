"""One version everywhere, and a changelog of short entries.

pyproject.toml's `version`, `efficient_attn.__version__` and CHANGELOG.md's newest release
heading (the first `## <version>` after `## Unreleased`) name the same version; every
changelog entry (a line starting with '- ' and its indented continuation lines) is at most
two lines of at most 100 columns.
"""

import os
import re

import efficient_attn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_ENTRY_LINES = 2
MAX_COLUMNS = 100
RELEASE = re.compile(r'^## \[?(\d+\.\d+\.\d+)\]?(?: - (\d{4}-\d{2}-\d{2}))?$')


def _read(name: str) -> str:
  with open(os.path.join(ROOT, name), encoding='utf-8') as f:
    return f.read()


def pyproject_version(text: str) -> str:
  """The `version` of pyproject's [project] table (read by hand: Python 3.10 has no tomllib)."""
  table = re.search(r'^\[project\]\n(.*?)(?=^\[|\Z)', text, re.M | re.S)
  assert table, 'pyproject.toml has no [project] table'
  version = re.search(r'^version\s*=\s*"([^"]+)"', table.group(1), re.M)
  assert version, "pyproject.toml's [project] table has no version"
  return version.group(1)


def level2_headings(text: str):
  return [line for line in text.splitlines() if line.startswith('## ')]


def newest_release(text: str) -> str:
  """The version of the first release heading; Unreleased must come before it."""
  headings = level2_headings(text)
  assert headings and headings[0] == '## Unreleased', f'first section: {headings[:1]}'
  for heading in headings[1:]:
    match = RELEASE.match(heading)
    assert match, f'not a release heading (## <major.minor.patch> - <date>): {heading!r}'
    return match.group(1)
  raise AssertionError('CHANGELOG.md has no release heading')


def entries(text: str):
  """[(line number, [lines])] of each '- ' entry with its indented continuation lines."""
  found, lines = [], text.splitlines()
  for number, line in enumerate(lines, 1):
    if line.startswith('- '):
      found.append((number, [line]))
    elif (
      found and line.startswith(' ') and line.strip() and found[-1][0] + len(found[-1][1]) == number
    ):
      found[-1][1].append(line)
  return found


def test_versions_agree():
  version = pyproject_version(_read('pyproject.toml'))
  assert efficient_attn.__version__ == version
  assert newest_release(_read('CHANGELOG.md')) == version


def test_newest_release_is_dated():
  headings = [h for h in level2_headings(_read('CHANGELOG.md')) if h != '## Unreleased']
  assert RELEASE.match(headings[0]).group(2), f'the newest release has no date: {headings[0]!r}'


def test_changelog_entries_are_short():
  text = _read('CHANGELOG.md')
  found = entries(text)
  assert len(found) > 20, 'no entries read: has the list format changed?'
  long = [
    f'line {n}: {len(block)} lines: {block[0][:60]}...'
    for n, block in found
    if len(block) > MAX_ENTRY_LINES
  ]
  assert not long, 'entries over two lines:\n' + '\n'.join(long)
  wide = [
    f'line {n}: {len(line)} columns'
    for n, line in enumerate(text.splitlines(), 1)
    if len(line) > MAX_COLUMNS
  ]
  assert not wide, 'lines over 100 columns:\n' + '\n'.join(wide)


def test_entries_reads_continuations():
  text = '## Unreleased\n\n- one\n  two\n- three\n\n  not a continuation\n- four\n  x\n  y\n'
  assert [(n, len(b)) for n, b in entries(text)] == [(3, 2), (5, 1), (8, 3)]

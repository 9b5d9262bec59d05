"""Doc hygiene: what a tracked file must not hold. The linter step of README's test command
runs it.

    python -m studies.hygiene      # one line per problem; exit status 1 if there is any

Three rules, over the files git tracks:

1. No path of this machine in a .md, .py or .sh file, and none of any machine in a record.
   That means three things:
   - the checkout's parent folder, worked out from where this checkout lies;
   - a home directory: /root, /home/<user>, or wherever `~` expands;
   - any absolute path (/scratch/runs/..., /tmp/...) in a record: a .md or .json under
     docs/results/ or studies/, wherever this clone lies.
   A record names the runs of the machine that wrote it, which a clone elsewhere cannot
   tell from its own. Guides, code and tests may still use /tmp as an example destination
   or as scratch space at run time, and /data/... as an example of the user's folder.
   Write `runs/...`, `--root=runs/recall/...`, `../shared/data` or an environment variable
   instead.
2. No dated run log in a study's write-up: a line of a .md under studies/ with a date
   stamp (year-month-day) or a UTC time (hours:minutes UTC). When a run ran belongs in its
   own records (results.json, metrics.jsonl) or in the study's RUNLOG.md, which this rule
   skips. A generated report's header line that says when its measurement was made
   (`Measured on: ...`, `Report written on: ...`) is allowed. README.md and the guides
   under docs/ are not checked yet: they still hold dated lines that their owners move.
3. No file over 500 KB (LIMIT_BYTES) under docs/ or studies/. The largest committed
   figure or report is under half of that. A bigger file is a checkpoint, a log or an
   unshrunk figure: save figures at a lower dpi, and keep logs with the runs.
"""

import os
import re
import subprocess
import sys
import tempfile
from typing import Iterable, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_BYTES = 500 * 1024
TEXT_SUFFIXES = ('.md', '.py', '.sh')
SHARED_FOLDERS = ('', '/tmp', '/var/tmp', tempfile.gettempdir().rstrip('/'))
RECORDS = ('docs/results/', 'studies/')  # where any absolute path is the writer's machine's
RECORD_SUFFIXES = ('.md', '.json')
DATED = ('studies/',)  # where a dated line is a run log
SIZED = ('docs/', 'studies/')
RUNLOG = 'RUNLOG.md'
REPORT_HEADERS = ('Measured on:', 'Report written on:')
# A path starts where no path character precedes it: '/tmp/' in 'x/tmp/' is not one.
_START = r'(?<![\w.~/$-])'
# An absolute path with a folder ('/scratch/runs/x', '/tmp/D/res'); not a URL's '//host/'.
_ABSOLUTE = re.compile(_START + r'/[A-Za-z_][\w.-]*/')
_DATE = re.compile(r'\b20\d\d-[01]\d-[0-3]\d\b|\b[0-2]?\d:[0-5]\d\s*UTC\b')


def tracked(root: str = ROOT) -> List[str]:
  """The files git tracks under `root` (relative paths); outside a git checkout, every
  file but those under dot-folders."""
  listed = subprocess.run(['git', 'ls-files', '-z'], cwd=root, capture_output=True, text=True)
  if listed.returncode == 0:
    return sorted(p for p in listed.stdout.split('\0') if p)
  found = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
    found += [os.path.relpath(os.path.join(folder, f), root) for f in files]
  return sorted(found)


def machine_patterns(root: str = ROOT, home: Optional[str] = None) -> List[re.Pattern]:
  """The absolute paths of this machine that no tracked text names: the checkout's parent
  folder (unless it is a folder every machine has, / or a temporary folder: a clone in
  /tmp/x must not make every /tmp example a machine path; /tmp folders in records have
  their own rule), the home directories (/root, /home/<user> and `home`, by default where
  `~` expands)."""
  parent = os.path.dirname(os.path.abspath(root))
  if parent.rstrip('/') in SHARED_FOLDERS:
    parent = ''
  home = os.path.expanduser('~') if home is None else home
  prefixes = [home_dir + '/' for home_dir in ('/root', '/home/' + r'[^/\s<>]+')]
  for folder in (parent, home):
    if folder and folder.rstrip('/'):
      prefixes.append(re.escape(folder.rstrip('/')) + '/')
  return [re.compile(_START + p) for p in prefixes]


def _is_record(path: str) -> bool:
  return path.endswith(RECORD_SUFFIXES) and path.startswith(RECORDS)


def path_problems(path: str, text: str, patterns: Sequence[re.Pattern]) -> List[str]:
  """'path:line: ...' for each line of `text` that names a path of this machine (in a
  record: any absolute path)."""
  found = []
  patterns = [*patterns, _ABSOLUTE] if _is_record(path) else patterns
  for number, line in enumerate(text.splitlines(), 1):
    hits = [m.group(0) for p in patterns for m in p.finditer(line)]
    if hits:
      found.append(
        f'{path}:{number}: names a path of this machine ({hits[0]}...): write '
        f'runs/..., ../shared/... or an environment variable'
      )
  return found


def dated_problems(path: str, text: str) -> List[str]:
  """'path:line: ...' for each run-log line (a date or a UTC time) of a study's .md."""
  if not (path.endswith('.md') and path.startswith(DATED)) or os.path.basename(path) == RUNLOG:
    return []
  return [
    f'{path}:{number}: a dated run-log line ({_DATE.search(line).group(0)}): move it to '
    f'the runs\' records or to the study\'s {RUNLOG}'
    for number, line in enumerate(text.splitlines(), 1)
    if _DATE.search(line) and not line.strip().startswith(REPORT_HEADERS)
  ]


def size_problems(root: str, paths: Iterable[str], limit: int = LIMIT_BYTES) -> List[str]:
  """'path: ...' for each file under docs/ or studies/ larger than `limit` bytes."""
  found = []
  for path in paths:
    full = os.path.join(root, path)
    if path.startswith(SIZED) and os.path.isfile(full) and os.path.getsize(full) > limit:
      found.append(
        f'{path}: {os.path.getsize(full) / 1024:,.0f} KB, over the '
        f'{limit // 1024} KB limit: shrink it (a figure at a lower dpi) or keep it '
        f'out of the repository'
      )
  return found


def problems(
  root: str = ROOT, paths: Optional[Sequence[str]] = None, home: Optional[str] = None
) -> List[str]:
  """Every problem of the files `paths` (default: the tracked ones) under `root`."""
  paths = tracked(root) if paths is None else list(paths)
  patterns = machine_patterns(root, home)
  found = []
  for path in paths:
    full = os.path.join(root, path)
    if not (path.endswith(TEXT_SUFFIXES) or _is_record(path)) or not os.path.isfile(full):
      continue
    with open(full, encoding='utf-8', errors='replace') as f:
      text = f.read()
    found += path_problems(path, text, patterns) + dated_problems(path, text)
  return found + size_problems(root, paths)


def portable(arg: str, root: str = ROOT, home: Optional[str] = None) -> str:
  """A command-line argument as a record may name it: an absolute path under the checkout's
  parent folder relative to the checkout ('/x/runs/a' -> '../runs/a' for a checkout at
  /x/main), one under the home directory from '~'; a '--flag=' keeps its flag. Any other
  path stays as it is, for the check to name."""
  flag, eq, value = arg.partition('=') if arg.startswith('--') else ('', '', arg)
  home = os.path.expanduser('~') if home is None else home
  parent = os.path.dirname(os.path.abspath(root))
  if value.startswith('/'):
    if parent.rstrip('/') and value.startswith(parent.rstrip('/') + '/'):
      value = os.path.relpath(value, root)
    elif home.rstrip('/') and value.startswith(home.rstrip('/') + '/'):
      value = '~/' + value[len(home.rstrip('/')) + 1 :]
  return flag + eq + value


def main() -> int:
  found = problems()
  for line in found:
    print(line)
  if found:
    print(
      f'{len(found)} doc-hygiene problem(s); the rules are in studies/hygiene.py', file=sys.stderr
    )
  return 1 if found else 0


if __name__ == '__main__':
  sys.exit(main())

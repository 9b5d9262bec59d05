"""CI runs exactly the README's test command, and that command prints the slowest tests."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_ci_runs_the_readme_test_command():
  with open(os.path.join(ROOT, 'README.md')) as f:
    block = re.search(r'^Run the linter and the tests.*?```bash\n(.*?)\n```', f.read(), re.M | re.S)
  assert block, "README.md has no 'Run the linter and the tests' block"
  command = block.group(1).strip()
  steps = command.split(' && ')  # e.g. the linter, then the tests
  with open(os.path.join(ROOT, '.ci', 'run')) as f:
    tail = f.read().strip().splitlines()[-len(steps) :]
  assert tail == steps[:-1] + [f'exec {steps[-1]}'], (tail, command)
  assert steps[0].split()[:2] == ['.venv/bin/ruff', 'check'], command  # lint before tests
  assert '--durations=10' in command.split()

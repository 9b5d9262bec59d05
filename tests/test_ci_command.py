"""CI runs exactly the README's test command, and that command prints the slowest tests."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ci_runs_the_readme_test_command():
  with open(os.path.join(ROOT, 'README.md')) as f:
    block = re.search(r'^Run the tests.*?```bash\n(.*?)\n```', f.read(), re.M | re.S)
  assert block, "README.md has no 'Run the tests' block"
  command = block.group(1).strip()
  with open(os.path.join(ROOT, '.ci', 'run')) as f:
    last = f.read().strip().splitlines()[-1]
  assert last == f'exec {command}', (last, command)
  assert '--durations=10' in command.split()

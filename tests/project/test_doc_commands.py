"""Every command in the documentation runs as written: its module, config and flags exist.

The shell blocks (```bash) of README.md, CONTRIBUTING.md, docs/*.md and the studies' READMEs
are read as a reader would paste them: continuation lines joined, a `for` loop's variables
given a value, comments dropped. For each `python main.py ...` the config file builds with
its argument and every `--config.*` override names a field; for each `python -m <module>`
the module exists and defines every flag the command passes (absl or argparse; a sweep's
file builds with its settings). Nothing is trained or downloaded: a command that names a
user's data or a bucket is checked for its flags only.
"""

import glob
import importlib
import importlib.util
import os
import re
import shlex

from absl import flags
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = (
  ['README.md', 'CONTRIBUTING.md']
  + sorted(glob.glob('docs/*.md', root_dir=ROOT))
  + sorted(glob.glob('studies/*/README.md', root_dir=ROOT))
  + ['studies/README.md']
)
# Shell variables of the documented loops, given one of their values.
VARIABLES = {
  's': '0',
  'seed': '0',
  'm': 'softmax',
  'n': '1000',
  'lr': '1e-2',
  'v': '1024',
  'w': '64',
  'root': 'seed0',
  'R': 'softmax',
  'OUT': 'runs/out',
}
NOT_CHECKED = ('pytest', 'venv', 'build', 'sphinx', 'pip')  # others' tools, run by CI itself


def _blocks(path):
  with open(os.path.join(ROOT, path)) as f:
    return re.findall(r'^```(?:bash|sh|shell)\n(.*?)^```', f.read(), re.M | re.S)


def _commands(block):
  text = re.sub(r'\\\n\s*', ' ', block)
  for line in text.splitlines():
    line = re.sub(r'(^|\s)#.*$', '', line).strip()
    line = re.sub(r'\$\{?(\w+)\}?', lambda m: VARIABLES.get(m.group(1), m.group(0)), line)
    for part in re.split(r'\s*(?:&&|;|\|)\s*', line):
      words = part.split()
      if 'python' in ' '.join(words[:2]) and '$(' not in part:
        yield part


def _documented():
  found = []
  for path in DOCS:
    for block in _blocks(path):
      for command in _commands(block):
        found.append((path, command))
  return found


def _argv(command):
  words = shlex.split(command.replace('<', '').replace('>', ''))
  start = next(i for i, w in enumerate(words) if re.search(r'python3?$', w))
  return words[start + 1 :]


COMMANDS = _documented()


def test_the_documents_have_commands_to_check():
  assert len(COMMANDS) > 60, len(COMMANDS)
  assert any(c.startswith('python main.py') for _, c in COMMANDS)


def _defined_flags(module_name):
  """The flag names `module_name` defines: its `define_flags(fv)` (the benchmarks' tools),
  else the absl flags its source defines at module level (read, not imported: two tools
  that define the same flag name cannot share one process's FLAGS)."""
  spec = importlib.util.find_spec(module_name)
  with open(spec.origin) as f:
    source = f.read()
  if 'def define_flags(fv' in source:
    fv = flags.FlagValues()
    importlib.import_module(module_name).define_flags(fv)
    return set(fv)
  return set(
    re.findall(r"DEFINE_\w+\(\s*'(\w+)'", source)
    + re.findall(r"add_argument\(\s*'--([\w-]+)'", source)
  )


def _check_flags(module_name, args):
  names = _defined_flags(module_name)
  for arg in args:
    if not arg.startswith('--'):
      continue
    name = arg[2:].split('=', 1)[0]
    if name.startswith('config.'):
      continue
    known = name in names or (name.startswith('no') and name[2:] in names)
    assert known or name in ('help', 'helpfull'), (
      f'{module_name} has no flag --{name}; its flags: {sorted(names)}'
    )


def _check_main(args):
  from train import api  # pylint: disable=g-import-not-at-top

  _check_flags('main', [a for a in args if not a.startswith('--config')])
  spec = next(a.split('=', 1)[1] for a in args if a.startswith('--config='))
  path, _, arg = spec.partition(':')
  assert os.path.exists(os.path.join(ROOT, path)), f'no config file {path}'
  make = api.config_function(path)
  config = make(arg) if arg else make()
  for a in args:
    if a.startswith('--config.'):
      key = a[len('--config.') :].split('=', 1)[0]
      node = config
      for part in key.split('.'):
        assert part in node, f'--config.{key}: {path} has no field {part!r}'
        node = node[part]


def _check_sweep(args):
  spec = next(a.split('=', 1)[1] for a in args if a.startswith('--sweep='))
  path, _, arg = spec.partition(':')
  assert os.path.exists(os.path.join(ROOT, path)), f'no sweep file {path}'
  if 'gs://' in arg or '/data/' in arg:
    return  # a user's data: the settings' names are checked by the sweep file itself
  loader = importlib.util.spec_from_file_location('doc_sweep', os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(loader)
  loader.loader.exec_module(module)
  assert module.get_sweep(arg) if arg else module.get_sweep(), path


@pytest.mark.parametrize('where,command', COMMANDS, ids=[f'{p}:{c[:60]}' for p, c in COMMANDS])
def test_a_documented_command_names_what_exists(where, command):
  args = _argv(command)
  if not args or args[0] != '-m' and not args[0].endswith('.py'):
    pytest.skip(f'not a python program: {command}')
  if args[0] == '-m':
    module_name = args[1]
    if module_name.split('.')[0] in NOT_CHECKED:
      return
    assert importlib.util.find_spec(module_name), f'{where}: no module {module_name}'
    _check_flags(module_name, args[2:])
    if module_name == 'train.sweep':
      _check_sweep(args[2:])
    return
  script = args[0]
  assert os.path.exists(os.path.join(ROOT, script)), f'{where}: no file {script}'
  if script == 'main.py':
    _check_main(args[1:])

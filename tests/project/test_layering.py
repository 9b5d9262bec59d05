"""The tools use only the trainer's public face (read from the import graph with `ast`).

`benchmarks/`, `examples/`, `studies/` and `sweeps/` may import `train.api` (the
trainer's public face) and `data` (the data package's public functions), and
nothing else of `train/` or `data/`: a change inside the trainer or the data
package cannot then break a tool, and a reader sees in one file what each offers.
"""

import ast
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ('benchmarks', 'examples', 'studies', 'sweeps')
PACKAGES = ('train', 'data')
PUBLIC = ('train.api', 'data')


def _ours(module: str) -> bool:
  return module.split('.')[0] in PACKAGES


def trainer_imports(source: str):
  """[(line, module, name)] of every import of `train` or `data` in `source`, at any depth.

  `from train import x` gives module 'train.x' (x is a submodule of the package);
  `from train.m import y` gives ('train.m', 'y'); `import train.m` gives ('train.m', '');
  `from data import f` gives ('data', 'f') (the package's public face holds functions).
  """
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [(node.lineno, a.name, '') for a in node.names if _ours(a.name)]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      if node.module == 'train':
        found += [(node.lineno, f'train.{a.name}', '') for a in node.names]
      elif _ours(node.module):
        found += [(node.lineno, node.module, a.name) for a in node.names]
  return found


def _submodule(module: str, name: str) -> bool:
  folder = ROOT.joinpath(*module.split('.'))
  return (folder / f'{name}.py').exists() or (folder / name).is_dir()


def violations(source: str):
  """The imports of `source` that reach past the public face: a module other than
  PUBLIC (or one inside it, `from data import specs` included), or
  a private name (`_x`, `*`) of a public one."""
  return [
    f'line {line}: {module}' + (f'.{name}' if name else '')
    for line, module, name in trainer_imports(source)
    if module not in PUBLIC
    or name.startswith('_')
    or name == '*'
    or (name and _submodule(module, name))
  ]


def test_tools_import_only_the_trainers_public_face():
  bad = {}
  for folder in TOOLS:
    for path in sorted((ROOT / folder).rglob('*.py')):
      found = violations(path.read_text())
      if found:
        bad[str(path.relative_to(ROOT))] = found
  assert not bad, f'imports of private trainer modules (use train.api): {bad}'


def test_the_rule_sees_every_form_of_import():
  source = '\n'.join(
    [
      'from train import api',
      'import data',
      'from train.api import build',
      'import train.api',
      'def f():',
      '  from train import steps as steps_lib',  # deferred, aliased
      '  import train.checkpoint',
      '  from data import get_eval_batch, specs',  # a function; a submodule
      '  from data.specs import DATASETS',
      '  import data.stream',
      '  from train.api import _private',
      '  from train import *',
    ]
  )
  assert violations(source) == [
    'line 6: train.steps',
    'line 7: train.checkpoint',
    'line 8: data.specs',
    'line 9: data.specs.DATASETS',
    'line 10: data.stream',
    'line 11: train.api._private',
    'line 12: train.*',
  ]


def _imported_modules(source: str):
  """The modules `source` imports (at any depth): `import a.b` gives 'a.b', `from a import b`
  gives 'a.b' (a submodule, or a name in `a`), e.g. {'jax', 'data', 'configs.fields'}."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      found |= {f'{node.module}.{a.name}' for a in node.names}
  return found


def _within(module: str, allowed) -> bool:
  """Whether `module` is one of `allowed` (a package or a module) or inside one."""
  return any(module == a or module.startswith(a + '.') for a in allowed)


# The project's top-level packages and modules.
PROJECT = (
  'efficient_attn',
  'data',
  'train',
  'configs',
  'benchmarks',
  'studies',
  'sweeps',
  'examples',
  'main',
)


def higher_imports(source: str, allowed):
  """The modules of the project `source` imports that are not within `allowed`."""
  return sorted(
    m for m in _imported_modules(source) if _within(m, PROJECT) and not _within(m, allowed)
  )


def test_the_layer_rule_reads_modules():
  source = '\n'.join(
    [
      'from configs import fields',
      'from configs.fields import Field',
      'def f():',
      '  from configs import common',  # deferred
      '  import configs.presets',
      '  import configs',
      '  from train import api',
      '  import jax.numpy',
    ]
  )
  found = higher_imports(source, {'configs.fields', 'data', 'efficient_attn'})
  assert found == ['configs', 'configs.common', 'configs.presets', 'train.api']


def test_the_layers_import_only_downwards():
  """`configs.fields` (the config's fields, shared; with `configs/__init__.py`, which
  importing it runs) imports none of the project; `data` none of the trainer, configs
  (but `configs.fields`) or tools; the library none of the rest. The trainer may import
  all three."""
  below = {
    'configs.fields': (
      [ROOT / 'configs' / '__init__.py', ROOT / 'configs' / 'fields.py'],
      set(),
    ),
    'data': (sorted((ROOT / 'data').rglob('*.py')), {'configs.fields', 'data', 'efficient_attn'}),
    'efficient_attn': (sorted((ROOT / 'efficient_attn').rglob('*.py')), {'efficient_attn'}),
  }
  bad = {}
  for paths, allowed in below.values():
    for path in paths:
      found = higher_imports(path.read_text(), allowed)
      if found:
        bad[str(path.relative_to(ROOT))] = found
  assert not bad, f'imports of a higher layer: {bad}'


def _layout_block() -> str:
  readme = (ROOT / 'README.md').read_text()
  section = readme.split('\n## Layout\n', 1)[1].split('\n## ', 1)[0]
  return section.split('```\n', 2)[1]


def test_the_readme_layout_matches_the_tree():
  """Every tracked top-level folder and file has its row in README's Layout, and every
  row names a path that exists (a row indented under a folder's row is inside it, at any
  depth: two spaces a level)."""
  listed = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True)
  if listed.returncode:
    pytest.skip('not a git checkout')
  tree = {p.split('/')[0] + ('/' if '/' in p else '') for p in listed.stdout.split()}
  rows, named, folders = set(), set(), []  # folders: the open folder at each depth
  for line in _layout_block().splitlines():
    head = re.split(r'\s{2,}', line.strip())[0]  # the name column ends at a run of spaces
    if not head or line.startswith(' ' * 25):
      continue
    depth = (len(line) - len(line.lstrip(' '))) // 2
    folders = folders[:depth]
    parent = ''.join(folders)
    names = [n.strip() for n in head.split(',') if n.strip()]
    for name in names:
      named.add(parent + name)
      if depth == 0:
        rows.add(name.split('/')[0] + ('/' if '/' in name else ''))
    if len(names) == 1 and names[0].endswith('/'):
      folders.append(names[0])
  assert tree - rows == set(), 'top-level parts without a Layout row'
  assert rows - tree == set(), 'Layout rows of top-level parts that are not tracked'
  missing = sorted(p for p in named if not (ROOT / p).exists())
  assert not missing, f'Layout rows naming no file: {missing}'


def _data_modules_imported(path: pathlib.Path, modules) -> set:
  """The modules of `data/` (names in `modules`) that `path` imports, at any depth."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name.split('.')[1] for a in node.names if a.name.startswith('data.')}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == 'data':
      found |= {a.name for a in node.names if a.name in modules}
    elif (
      isinstance(node, ast.ImportFrom)
      and node.level == 0
      and node.module
      and (node.module.startswith('data.'))
    ):
      found.add(node.module.split('.')[1])
  return found & modules


def import_cycle(graph) -> list:
  """A cycle [a, b, ..., a] of `graph` ({module: modules it imports}), or []."""
  state, path = {}, []

  def visit(node):
    state[node] = 'open'
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 'open':
        return path[path.index(nxt) :] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    state[node] = 'done'
    path.pop()
    return []

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return []


def test_the_data_modules_import_no_cycle():
  """No module of `data/` imports one that imports it back, at the top or inside a function
  (a deferred import hides a cycle rather than removing it). The package's `__init__.py`,
  its public face over the modules, is left out."""
  paths = {p.stem: p for p in (ROOT / 'data').glob('*.py') if p.stem != '__init__'}
  graph = {name: _data_modules_imported(path, set(paths)) for name, path in paths.items()}
  assert graph['arrays'] and graph['checks'], 'the rule sees no import'
  cycle = import_cycle(graph)
  assert not cycle, f'import cycle among data/ modules: {" -> ".join(cycle)}'


def _imports_the_package(path: pathlib.Path, modules) -> bool:
  """Whether `path` imports the `data` package itself (`import data`, or a name from
  `from data import ...` that is not one of its modules), at any depth."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import) and any(a.name == 'data' for a in node.names):
      return True
    if (
      isinstance(node, ast.ImportFrom)
      and node.level == 0
      and node.module == 'data'
      and any(a.name not in modules for a in node.names)
    ):
      return True
  return False


def test_no_data_module_imports_the_package():
  """The package's `__init__.py` imports its modules, so a module that imports the package
  (even inside a function) closes a cycle through it."""
  paths = {p.stem: p for p in (ROOT / 'data').glob('*.py') if p.stem != '__init__'}
  assert _imports_the_package(ROOT / 'train' / 'tasks' / 'pixel_lm.py', set(paths))
  found = sorted(name for name, path in paths.items() if _imports_the_package(path, set(paths)))
  assert not found, f'data/ modules that import the package: {found}'


def test_the_cycle_rule_finds_a_cycle():
  assert import_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == ['a', 'b', 'c', 'a']
  assert import_cycle({'a': {'b'}, 'b': set(), 'c': {'a', 'b'}}) == []


def _library_imports(path: pathlib.Path):
  """The modules of `efficient_attn` and the third-party top-level packages `path` imports
  (at any depth): `from efficient_attn.ops import masking` gives 'efficient_attn.ops.masking'
  where that is a module, else 'efficient_attn.ops'."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      for alias in node.names:
        name = f'{node.module}.{alias.name}'
        module_path = ROOT.joinpath(*name.split('.'))
        is_module = module_path.with_suffix('.py').exists() or module_path.is_dir()
        found.add(name if node.module.startswith('efficient_attn') and is_module else node.module)
  return found


def _library_graph():
  """{module: the library modules it imports} over every module of `efficient_attn`."""
  graph = {}
  for path in sorted((ROOT / 'efficient_attn').rglob('*.py')):
    parts = path.relative_to(ROOT).with_suffix('').parts
    module = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
    graph[module] = {m for m in _library_imports(path) if m.startswith('efficient_attn')}
  return graph


def test_the_library_imports_no_cycle():
  """No module of `efficient_attn` imports, directly or through others, one that imports it
  (a package's `__init__` counts as the module of its folder)."""
  graph = _library_graph()
  graph = {m: {n for n in deps if n in graph and n != m} for m, deps in graph.items()}
  cycle = import_cycle(graph)
  assert not cycle, f'an import cycle in the library: {" -> ".join(cycle)}'


# What each part of the library may import (besides itself, jax and numpy): the math knows
# no Flax and no declarations; declarations know the math; layers know both; models all.
# `declaration` (what a mechanism declares) is the registry's part, below its table.
LIBRARY_PARTS = {
  'efficient_attn.ops': {'efficient_attn.ops'},
  'efficient_attn.declaration': {'efficient_attn.ops'},
  'efficient_attn.registry': {'efficient_attn.ops', 'efficient_attn.declaration'},
  'efficient_attn.mechanisms': {
    'efficient_attn.ops',
    'efficient_attn.declaration',
    'efficient_attn.registry',
    'efficient_attn.mechanisms',
  },
  'efficient_attn.layers': {
    'efficient_attn.ops',
    'efficient_attn.declaration',
    'efficient_attn.registry',
    'efficient_attn.layers',
  },
  'efficient_attn.models': {
    'efficient_attn.ops',
    'efficient_attn.declaration',
    'efficient_attn.registry',
    'efficient_attn.layers',
    'efficient_attn.models',
  },
}


def _part(module: str) -> str:
  return next((p for p in LIBRARY_PARTS if module == p or module.startswith(p + '.')), module)


def test_the_library_parts_import_only_downwards():
  bad = {}
  for path in sorted((ROOT / 'efficient_attn').rglob('*.py')):
    parts = path.relative_to(ROOT).with_suffix('').parts
    module = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
    part = _part(module)
    if part not in LIBRARY_PARTS:
      continue
    imports = _library_imports(path)
    wrong = sorted(
      m
      for m in imports
      if (
        m.startswith('efficient_attn')
        and _part(m) not in LIBRARY_PARTS[part]
        and m != 'efficient_attn'
      )
      or (part == 'efficient_attn.ops' and m.split('.')[0] == 'flax')
    )
    if wrong:
      bad[str(path.relative_to(ROOT))] = wrong
  assert not bad, f'library modules importing a part above theirs (or ops importing flax): {bad}'

"""The documentation site builds with warnings as errors, by CONTRIBUTING.md's one command.

One build, read by one test: it passes with warnings as errors (a broken internal link
or anchor is MyST's `myst.xref_missing`, an undocumented public name is
docs/_ext/public_api.py's warning), every public name has its entry, every registered
mechanism is on the Mechanisms page with the README's table. The rules themselves are
tested on small modules and docstrings, without a build.
"""

import ast
import html as html_lib
import importlib
import os
import re
import subprocess
import sys

import pytest

if sys.version_info < (3, 11):
  pytest.skip(
    'the documentation toolchain pinned in requirements.txt needs Python >= 3.11',
    allow_module_level=True,
  )

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'docs', '_ext'))

import docstrings  # noqa: E402  (docs/_ext)
import public_api  # noqa: E402


def _public_api_modules():
  """docs/conf.py's `public_api_modules` (read, not run): every public name of these
  modules must have its entry in the API reference."""
  with open(os.path.join(ROOT, 'docs', 'conf.py')) as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], 'id', '') == 'public_api_modules':
      return ast.literal_eval(node.value)
  raise AssertionError('docs/conf.py sets no public_api_modules')


def _contributing_command():
  """CONTRIBUTING.md's command that builds the site (its Documentation section)."""
  with open(os.path.join(ROOT, 'CONTRIBUTING.md')) as f:
    block = re.search(r'^## Documentation.*?```bash\n(.*?)\n```', f.read(), re.M | re.S)
  assert block, "CONTRIBUTING.md has no '## Documentation' section with a bash block"
  return block.group(1).strip()


def _build(workdir):
  """CONTRIBUTING.md's command, writing into `workdir` instead of docs/_build/html:
  (return code, its output, the html folder)."""
  command = _contributing_command().split()
  assert command[:8] == [
    '.venv/bin/python',
    '-m',
    'sphinx',
    '-W',
    '--keep-going',
    '-c',
    'docs',
    '-b',
  ], command
  assert command[-1] == 'docs/_build/html', command
  command[0] = sys.executable  # .venv/bin/python, whichever runs the tests
  html = os.path.join(workdir, 'html')
  command[-1] = html
  command += ['-d', os.path.join(workdir, 'doctrees'), '-q']
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
  return result.returncode, result.stdout + result.stderr, html


def _read(folder, page):
  with open(os.path.join(folder, page), encoding='utf-8') as f:
    return f.read()


@pytest.mark.slow  # a process, about 15 s of one core
def test_the_site_builds_with_warnings_as_errors(tmp_path):
  """One build (about 15 s of one core), every check on it: a single test, so that no
  other xdist worker waits for it."""
  returncode, log, html = _build(str(tmp_path))
  assert returncode == 0, f'the documentation build failed (warnings are errors):\n{log}'
  assert os.path.exists(os.path.join(html, 'docs', 'index.html'))
  assert 'docs/index.html' in _read(html, 'index.html')  # the root sends browsers there

  # every public name has its entry in the API reference
  api = os.path.join(html, 'docs', 'api')
  pages = ''.join(_read(api, page) for page in os.listdir(api))
  modules = _public_api_modules()
  assert 'efficient_attn.models.generate' in modules, modules
  for modname in modules:
    names = public_api.public_names(importlib.import_module(modname))
    assert names, modname
    for name in names:
      full = f'{modname}.{name}'
      assert f'id="{full}"' in pages or f'id="module-{full}"' in pages, full
  # the families' pure functions come from the package itself, whichever exist
  assert 'id="efficient_attn.mechanisms.linear_attention"' in pages

  # every registered mechanism: its describe() and its row of the README's table
  import efficient_attn  # pylint: disable=g-import-not-at-top

  page = _read(os.path.join(html, 'docs'), 'mechanisms.html')
  text = html_lib.unescape(page)
  for name in efficient_attn.list_mechanisms():
    first_line = efficient_attn.get_mechanism(name).describe().splitlines()[0]
    assert first_line in text, first_line
    assert re.search(rf'<td[^>]*><p><code[^>]*><span class="pre">{name}</span></code>', page), name

  # every page has a title (a study's report without a heading is titled by its file)
  for folder, _, files in os.walk(html):
    for name in files:
      if name.endswith('.html'):
        assert '&lt;no title&gt;' not in _read(folder, name), os.path.join(folder, name)


def _module(tmp_path, monkeypatch, name, source):
  (tmp_path / f'{name}.py').write_text(source)
  monkeypatch.syspath_prepend(str(tmp_path))
  module = importlib.import_module(name)
  monkeypatch.setitem(sys.modules, name, module)  # removed again after the test
  return module


def test_public_names_rule(tmp_path, monkeypatch):
  without_all = _module(
    tmp_path,
    monkeypatch,
    'docs_rule_a',
    '''
import functools
from typing import Any
from os import path as joined

Alias = functools.partial
VALUE = 1
_private = 2
if True:
  def inside_if():
    """Doc."""

def function():
  """Doc."""

class Class:
  pass
''',
  )
  # bound by the module's own def, class or assignment; not by an import
  assert public_api.public_names(without_all) == [
    'Alias',
    'VALUE',
    'inside_if',
    'function',
    'Class',
  ]
  with_all = _module(
    tmp_path,
    monkeypatch,
    'docs_rule_b',
    '''
from os.path import join
__all__ = ['join', 'own']
def own():
  pass
def other():
  pass
def __dir__():
  return ['lazy_attention']
''',
  )
  # exactly __all__ (re-exports included), plus what the module's __dir__ lists
  assert public_api.public_names(with_all) == ['join', 'own', 'lazy_attention']


def test_problems_name_each_missing_or_docstring_less_name(tmp_path, monkeypatch):
  _module(
    tmp_path,
    monkeypatch,
    'docs_rule_c',
    '''
import dataclasses

#: Documented data.
VALUE = 1
BARE = 2

def function():
  """Doc."""

def bare():
  pass

@dataclasses.dataclass
class Generated:
  x: int = 0
''',
  )
  documented = {f'docs_rule_c.{n}' for n in ('VALUE', 'BARE', 'function', 'bare', 'Generated')}
  docstring_less = [
    'docs_rule_c.BARE has no docstring',
    'docs_rule_c.bare has no docstring',
    'docs_rule_c.Generated has no docstring',
  ]
  assert public_api.problems(['docs_rule_c'], documented) == docstring_less
  assert public_api.problems(['docs_rule_c'], documented - {'docs_rule_c.function'}) == [
    docstring_less[0],
    'docs_rule_c.function is public but not in the API reference (autodoc it in docs/api/)',
    *docstring_less[1:],
  ]


def test_indented_examples_become_literal_blocks():
  lines = [
    'Summary.',
    '',
    '    run = api.build(config)',
    '    for _ in range(3):',
    '      step()',
    '',
    'Args:',
    '  x: a value.',
    '',
    '      more about x.',
    '',
    '- item',
    '',
    '      continued item',
    '',
    'Example::',
    '',
    '    kept',
  ]
  assert docstrings.literal_blocks(lines) == [
    'Summary.',
    '',
    '::',
    '',
    '    run = api.build(config)',
    '    for _ in range(3):',
    '      step()',
    '',
    'Args:',
    '  x: a value.',
    '',
    '      more about x.',
    '',
    '- item',
    '',
    '      continued item',
    '',
    'Example::',
    '',
    '    kept',
  ]
  assert docstrings.respell("(dtype=<class 'jax.numpy.float32'>, f=<function g at 0x1>)") == (
    '(dtype=jax.numpy.float32, f=...)'
  )
  assert docstrings.module_signature(dict) is None  # not a Flax module

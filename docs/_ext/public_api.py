"""Every public name of the library's API modules is documented, or the build fails.

The rule (for each module of the `public_api_modules` setting in docs/conf.py):

- A module with `__all__` makes public exactly the names in it, re-exports included
  (`efficient_attn`'s `MultiHeadAttention` is documented as `efficient_attn.MultiHeadAttention`).
- A module without `__all__` makes public every name its own top-level statements bind
  with `def`, `class` or an assignment, not starting with `_`. An alias counts (train/api.py's
  `Checkpointer = checkpoint.Checkpointer` is the module saying the name is part of its
  face); a name bound by `import` / `from ... import` does not (`jax`, `functools`, typing
  names are what the module uses, not what it offers) unless `__all__` lists it.
- A module that defines `__dir__` also makes public every name it lists there:
  `efficient_attn.mechanisms` serves its families' pure functions (`*_attention`,
  `*_attention_step`, ...) by `__getattr__`, so a new one is covered the moment it exists.
- Documented means: autodoc documented the name under that module's path (the Python
  domain holds `<module>.<name>`), and it has a docstring of its own: a function's or
  class's `__doc__` (not a dataclass's or namedtuple's generated signature, nor one
  inherited from its type), a module's docstring, or for data a `#:` comment or a string
  right after the assignment. Class members are documented with their class (`:members:`)
  and not checked one by one.

At the end of the build, each public name that is not documented, or has no docstring,
is one warning naming it (an error under `-W`).

`autopublic` writes the autodoc directives for a module's public names (all, or those not
named in `:exclude:`), in `{eval-rst}` blocks:

    ```{eval-rst}
    .. autopublic:: efficient_attn.mechanisms
       :exclude: FUNCTIONS pure_function
    ```
"""

import ast
import importlib
import inspect
import types

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

logger = logging.getLogger(__name__)


def _bound_at_top_level(module: types.ModuleType):
  """Names the module's own top-level statements bind by def, class or assignment (in
  order; statements inside top-level `if` / `try` blocks included), not by import."""
  tree = ast.parse(inspect.getsource(module))
  names = []

  def targets(node):
    if isinstance(node, ast.Name):
      yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
      for element in node.elts:
        yield from targets(element)

  def visit(body):
    for node in body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.append(node.name)
      elif isinstance(node, ast.Assign):
        for target in node.targets:
          names.extend(targets(target))
      elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        names.extend(targets(node.target))
      elif isinstance(node, ast.If):
        visit(node.body)
        visit(node.orelse)
      elif isinstance(node, ast.Try):
        for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
          visit(block)

  visit(tree.body)
  return names


def public_names(module: types.ModuleType):
  """The module's public names by the rule above, in order of first appearance."""
  if hasattr(module, '__all__'):
    names = list(module.__all__)
  else:
    names = _bound_at_top_level(module)
  if '__dir__' in vars(module):
    names += list(module.__dir__())
  out = []
  for name in names:
    if not name.startswith('_') and name not in out:
      out.append(name)
  return out


def _generated_doc(obj) -> bool:
  """A docstring Python wrote, not the author: a dataclass's or namedtuple's signature."""
  doc = vars(obj).get('__doc__') or ''
  return doc.startswith(f'{obj.__name__}(')


def has_docstring(module: types.ModuleType, name: str) -> bool:
  """Whether `module.<name>` has a docstring of its own (see the rule above)."""
  obj = getattr(module, name)
  if isinstance(obj, type):
    doc = vars(obj).get('__doc__')
    return bool(doc and doc.strip()) and not _generated_doc(obj)
  if isinstance(obj, types.ModuleType) or callable(obj):
    doc = getattr(obj, '__doc__', None)
    if isinstance(obj, types.ModuleType) or inspect.isroutine(obj):
      return bool(doc and doc.strip())
    return bool(doc and doc.strip()) and doc is not getattr(type(obj), '__doc__', None)
  from sphinx.pycode import ModuleAnalyzer  # pylint: disable=g-import-not-at-top

  return ('', name) in ModuleAnalyzer.for_module(module.__name__).find_attr_docs()


def problems(modules, documented):
  """One line per public name of `modules` (names) that is not in `documented` (full
  names autodoc documented) or has no docstring of its own."""
  out = []
  for modname in modules:
    module = importlib.import_module(modname)
    for name in public_names(module):
      full = f'{modname}.{name}'
      if full not in documented:
        out.append(f'{full} is public but not in the API reference (autodoc it in docs/api/)')
      elif not has_docstring(module, name):
        out.append(f'{full} has no docstring')
  return out


class AutoPublic(SphinxDirective):
  """autodoc directives for a module's public names (see the module's docstring)."""

  required_arguments = 1
  option_spec = {'exclude': directives.unchanged}

  def run(self):
    modname = self.arguments[0]
    module = importlib.import_module(modname)
    exclude = set(self.options.get('exclude', '').split())
    lines = []
    for name in public_names(module):
      if name in exclude:
        continue
      obj = getattr(module, name)
      if isinstance(obj, types.ModuleType):
        kind = 'automodule'
      elif isinstance(obj, type):
        kind = 'autoexception' if issubclass(obj, BaseException) else 'autoclass'
      elif callable(obj):
        kind = 'autofunction'
      else:
        kind = 'autodata'
      lines += [f'.. {kind}:: {modname}.{name}', '']
    source, _ = self.get_source_info()
    holder = nodes.section()
    nested_parse_with_titles(self.state, StringList(lines, source), holder)
    return holder.children


def _check(app, exception):
  if exception is not None or app.builder.format != 'html':
    return
  documented = set(app.env.domains.python_domain.objects)
  for line in problems(app.config.public_api_modules, documented):
    logger.warning(line, type='public_api', subtype='undocumented')


def setup(app):
  app.add_config_value('public_api_modules', [], 'env', types=[list])
  app.add_directive('autopublic', AutoPublic)
  app.connect('build-finished', _check)
  return {'version': '1', 'parallel_read_safe': True, 'parallel_write_safe': True}

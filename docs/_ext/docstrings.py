"""The project's docstrings and Flax modules' signatures, rendered.

Docstrings: an indented block after a blank line is code.

The docstrings here show examples as a block indented by four or more spaces after a blank
line, as PEP 257's do (`efficient_attn/__init__.py`, `train/api.py`, the formulas in the
mechanisms'), with no reStructuredText `::` before them; reStructuredText would read them
as block quotes or definition lists, and warn where a continuation line is indented
further. Before napoleon reads the Google-style sections, this puts a `::` paragraph
(which reStructuredText drops) before each such block, so it renders as a literal block.

Left alone: a block after a line that already ends with `::`, inside a napoleon section
(`Args:`, `Returns:`, `Example:`, ... down to the next line as little indented as the
header), after a directive (`.. name::`) and after a list item. Everything else in a
docstring is reStructuredText with napoleon's Google-style sections; `code` is the default
role (docs/conf.py), so `name` renders as code, as in the Markdown pages.

Signatures of Flax modules: a Linen module's is its dataclass fields without Flax's own
`parent` and `name`, an NNX module's its `__init__`'s (autodoc would show the metaclass's
`(*args, **kwargs)`); without annotations (the docstring's Attributes give the types), and
a default that has no Python spelling (an initialiser made inside a function) as `...`;
in any other signature too (`dtype=<class 'jax.numpy.float32'>` is `dtype=jax.numpy.float32`).
"""

import inspect
import re

_SECTION = re.compile(r'^\s*[A-Z][A-Za-z ]*:\s*$')  # napoleon's `Args:`, `Returns:`, ...
_NOT_PROSE = re.compile(r'^\s*(\.\. |[-*+] |\d+[.)] |:\w)')  # a directive, list item, field
_STEP = 4  # how much further than the paragraph an example is indented


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip())


def literal_blocks(lines):
  """`lines` (a docstring, dedented) with a `::` paragraph before each example block."""
  out = []
  paragraph = None  # the first line of the paragraph in which the last text line is
  last = None  # the last non-blank line
  blank = False  # whether a blank line came since `last`
  block = None  # the indentation a literal block we opened must stay deeper than
  section = None  # the indentation of the napoleon section header we are under
  for line in lines:
    if not line.strip():
      out.append(line)
      blank = True
      continue
    indent = _indent(line)
    if block is not None and indent > block:
      out.append(line)  # inside the literal block
      last, blank = line, False
      continue
    block = None
    if section is not None and indent <= section:
      section = None
    if (
      blank
      and paragraph is not None
      and section is None
      and indent >= _indent(paragraph) + _STEP
      and not last.rstrip().endswith('::')
      and not _NOT_PROSE.match(paragraph)
    ):
      out += [' ' * _indent(paragraph) + '::', '']
      block = _indent(paragraph)
    elif blank or paragraph is None:
      paragraph = line
    if _SECTION.match(line):
      section = indent
    out.append(line)
    last, blank = line, False
  return out


def _process(app, what, name, obj, options, lines):
  lines[:] = literal_blocks(lines)


class _Spelled:
  """A default value shown as `text` in a signature."""

  def __init__(self, text):
    self.text = text

  def __repr__(self):
    return self.text


def _spell(value):
  text = repr(value)
  if not text.startswith('<'):
    return text
  qualname = getattr(value, '__qualname__', '')
  if not qualname or '<' in qualname:
    return '...'
  module = getattr(value, '__module__', '') or ''
  return (
    qualname
    if module.startswith(('builtins', 'jax._src')) or '._' in module
    else (f'{module}.{qualname}')
  )


def module_signature(cls):
  """The signature a Flax module class is shown with, or None for any other object."""
  if not isinstance(cls, type):
    return None
  from flax import linen  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  if issubclass(cls, linen.Module):
    params = [
      p for p in inspect.signature(cls).parameters.values() if p.name not in ('parent', 'name')
    ]
  elif issubclass(cls, nnx.Module):
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
  else:
    return None
  params = [
    p.replace(
      annotation=p.empty, default=p.default if p.default is p.empty else _Spelled(_spell(p.default))
    )
    for p in params
  ]
  return str(inspect.Signature(params))


_CLASS_REPR = re.compile(r"<class '([\w.]+)'>")
_OTHER_REPR = re.compile(r'<[^<>]*(<locals>[^<>]*)?>')


def respell(signature: str) -> str:
  """`signature` with each default that has no Python spelling (`<class 'x.y'>`,
  `<function f at 0x...>`) spelled `x.y` or `...`, so that it parses."""
  return _OTHER_REPR.sub('...', _CLASS_REPR.sub(r'\1', signature))


def _signature(app, what, name, obj, options, signature, return_annotation):
  if what == 'class':
    spelled = module_signature(obj)
    if spelled is not None:
      return spelled, None
  if signature and '<' in signature:
    return respell(signature), return_annotation
  return None


def setup(app):
  app.connect('autodoc-process-docstring', _process, priority=400)  # before napoleon (500)
  app.connect('autodoc-process-signature', _signature)
  return {'version': '1', 'parallel_read_safe': True, 'parallel_write_safe': True}

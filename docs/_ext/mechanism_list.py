"""The `mechanism-list` directive: every registered mechanism with its `describe()` text.

    ```{mechanism-list}
    ```

in a MyST page writes, for each name of `efficient_attn.list_mechanisms()` in the
registry's order, a heading, a link to the family's pure function
(`efficient_attn.mechanisms.pure_function(name)`) and the declaration's own `describe()`
(what it is, its cost, forms, options with types, ranges and defaults). The page is made
from the registry when the site is built, so it cannot go stale.
"""

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def markdown() -> str:
  """The list as MyST Markdown (third-level headings under the page's sections)."""
  import efficient_attn  # pylint: disable=g-import-not-at-top
  from efficient_attn import mechanisms  # pylint: disable=g-import-not-at-top

  out = []
  for name in efficient_attn.list_mechanisms():
    decl = efficient_attn.get_mechanism(name)
    function = mechanisms.pure_function(name).__name__
    out += [
      f'### `{name}`',
      '',
      f'Pure function: {{py:func}}`efficient_attn.mechanisms.{function}`.',
      '',
      '```text',
      decl.describe(),
      '```',
      '',
    ]
  return '\n'.join(out)


class MechanismList(SphinxDirective):
  has_content = False

  def run(self):
    holder = nodes.section()  # its children, the headings' sections, are returned
    source, _ = self.get_source_info()
    self.state.nested_parse(
      StringList(markdown().splitlines(), source), 0, holder, match_titles=True
    )
    return holder.children


def setup(app):
  app.add_directive('mechanism-list', MechanismList)
  return {'version': '1', 'parallel_read_safe': True, 'parallel_write_safe': True}

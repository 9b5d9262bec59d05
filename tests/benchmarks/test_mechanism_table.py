"""The README's mechanism table is generated from the declarations, and is current."""

import os

from benchmarks import mechanism_table
import efficient_attn as ea

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_table_is_current(monkeypatch):
  monkeypatch.chdir(ROOT)  # the table names its speed file relative to the repository
  text = mechanism_table.table(mechanism_table.SPEED_JSON, 4096)
  with open(os.path.join(ROOT, 'README.md')) as f:
    readme = f.read()
  assert f'{mechanism_table.START}\n{text}\n{mechanism_table.END}' in readme, (
    'README.md mechanism table is stale: run python -m benchmarks.mechanism_table '
    '--update=README.md'
  )


def test_every_mechanism_has_a_row_and_describes_itself():
  text = mechanism_table.table('', 4096)
  for decl in ea.registry.mechanisms():
    assert f'| `{decl.name}` | {decl.citation} |' in text
    described = decl.describe()
    assert described.startswith(f'{decl.name}: ') and decl.citation in described
    for option in decl.options:
      assert f'  {option.name}={option.default!r}: ' in described


def test_update_rewrites_only_between_the_markers(tmp_path):
  path = tmp_path / 'doc.md'
  path.write_text(f'before\n{mechanism_table.START}\nold\n{mechanism_table.END}\nafter\n')
  assert mechanism_table.update(str(path), 'new')
  assert path.read_text() == f'before\n{mechanism_table.START}\nnew\n{mechanism_table.END}\nafter\n'
  assert not mechanism_table.update(str(path), 'new')

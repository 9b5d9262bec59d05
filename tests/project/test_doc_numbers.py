"""The study write-ups: one template, and numbers with one source.

Every study README (studies/<name>/README.md) holds its results table between the markers,
generated from the study's JSON by studies/<name>/results.py (`python -m studies.tables`),
and the table in the file is what the JSON gives. A percentage or a decimal quoted in its
Findings is one of the generated table's numbers, or of a report the bullet links to, so a
hand-copied number that drifts fails here.
"""

import os
import re

import pytest

from studies import tables

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUDIES = tables.studies()
SECTIONS = (
  'Question',
  'Setup',
  'Results',
  'Findings',
  'How to reproduce',
  'Caveats and what was not run',
)
MAX_LINES = 220  # the template's "about 200", with room for a table to grow
MAX_WORDS = 45  # a sentence, or a Findings bullet: "under about 40 words"
# A number a finding quotes: a percentage, or a number with a decimal point.
QUOTED = re.compile(
  r'(?<![\w.,])(\d[\d,]*(?:\.\d+)?)\s*%'
  r'|(?<![\w.,])(\d[\d,]*\.\d+)(?![\w.]*\d)'
)
NUMBER = re.compile(r'\d[\d,]*(?:\.\d+)?')


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path)) as f:
    return f.read()


def _section(text: str, name: str) -> str:
  return text.split(f'\n## {name}\n', 1)[1].split('\n## ', 1)[0]


def bullets(section: str):
  """The top-level bullets of a section, each joined into one line."""
  found = []
  for line in section.splitlines():
    if line.startswith('- '):
      found.append(line[2:].strip())
    elif found and line.startswith('  ') and line.strip():
      found[-1] += ' ' + line.strip()
  return found


def quoted(text: str):
  """The numbers `text` quotes, commas dropped ('99.98', '12.5', '1568.0')."""
  return [(a or b).replace(',', '') for a, b in QUOTED.findall(text)]


def numbers(text: str):
  """Every number written in `text`, commas dropped ('21,004' -> '21004')."""
  return {n.replace(',', '') for n in NUMBER.findall(text)}


def unsourced(bullet: str, table: str, folder: str):
  """The numbers a Findings bullet quotes that neither the generated table nor a .md report
  the bullet links to (relative to `folder`) holds."""
  known = numbers(table)
  for link in re.findall(r'\]\(([^)#]+\.md)\)', bullet):
    path = os.path.join(folder, link)
    if os.path.exists(os.path.join(ROOT, path)):
      known |= numbers(_read(path))
  return [n for n in quoted(bullet) if n not in known]


def prose(text: str):
  """The paragraphs and bullets of `text` outside code blocks, tables, headings and the
  generated block, each joined into one line."""
  text = re.sub(re.escape(tables.START) + '.*?' + re.escape(tables.END), '', text, flags=re.S)
  text = re.sub(r'```.*?```', '', text, flags=re.S)
  blocks, current = [], []
  for line in text.splitlines():
    if not line.strip() or line.startswith(('#', '|', '!', '<!--')) or line.startswith('- '):
      if current:
        blocks.append(' '.join(current))
      current = [line[2:]] if line.startswith('- ') else []
    else:
      current.append(line.strip())
  return blocks + ([' '.join(current)] if current else [])


def sentences(paragraph: str):
  return [s for s in re.split(r'(?<=[.!?])\s+(?=[A-Z*(`\[])', paragraph) if s.strip()]


@pytest.mark.parametrize('study', STUDIES)
def test_the_table_in_the_readme_is_what_the_json_gives(study):
  path = f'studies/{study}/README.md'
  assert tables.current(_read(path), path) == tables.module(study).table(), (
    f'{path}: its results table is stale: run python -m studies.tables --update={path}'
  )


def test_the_index_is_what_the_studies_give():
  assert tables.current(_read(tables.INDEX)) == tables.index(), (
    f'run python -m studies.tables --update={tables.INDEX}'
  )


def test_the_front_page_quotes_the_studies_from_their_json():
  """README.md's results table is generated (a row per study, linking to it), and no other
  percentage in README.md repeats a study's number by hand."""
  readme = _read(tables.FRONT)
  assert tables.current(readme) == tables.front(), (
    f'run python -m studies.tables --update={tables.FRONT}'
  )
  outside = re.sub(r'```.*?```', '', readme.replace(tables.current(readme), ''), flags=re.S)
  assert not re.findall(r'\d+\.\d+ ?%', outside), (
    'a percentage copied by hand into README.md (outside its code blocks)'
  )


@pytest.mark.parametrize('study', STUDIES)
def test_the_readme_follows_the_template(study):
  text = _read(f'studies/{study}/README.md')
  headings = re.findall(r'^## (.+)$', text, re.M)
  assert headings == list(SECTIONS), headings
  assert text.startswith('# ') and len(text.splitlines()) <= MAX_LINES
  findings = bullets(_section(text, 'Findings'))
  assert 3 <= len(findings) <= 7, findings
  long = [b for b in findings if len(b.split()) > MAX_WORDS]
  assert not long, f'Findings bullets over {MAX_WORDS} words: {long}'
  long = [s for p in prose(text) for s in sentences(p) if len(s.split()) > MAX_WORDS]
  assert not long, f'sentences over {MAX_WORDS} words: {long}'


@pytest.mark.parametrize('study', STUDIES)
def test_the_findings_quote_only_the_generated_numbers(study):
  path = f'studies/{study}/README.md'
  text = _read(path)
  table = tables.current(text, path)
  bad = {b: unsourced(b, table, f'studies/{study}') for b in bullets(_section(text, 'Findings'))}
  bad = {b: n for b, n in bad.items() if n}
  assert not bad, f'{path}: numbers in Findings that the generated table does not hold: {bad}'


@pytest.mark.parametrize('study', STUDIES)
def test_every_relative_link_names_a_file(study):
  folder = f'studies/{study}'
  text = _read(f'{folder}/README.md')
  links = re.findall(r'\]\((?!https?:)([^)#\s]+)', text)
  missing = [link for link in links if not os.path.exists(os.path.join(ROOT, folder, link))]
  assert not missing, missing


def test_a_drifted_number_is_named():
  table = '| softmax | 99.98 ± 0.02% | 21,004 |'
  assert unsourced('softmax reaches 99.98%, with 21,004 bytes.', table, 'studies/x') == []
  assert unsourced('softmax reaches 99.97%.', table, 'studies/x') == ['99.97']
  assert unsourced('softmax leads by 0.02 points', table, 'studies/x') == []
  assert unsourced('at 12.5% and 1.5 times', table, 'studies/x') == ['12.5', '1.5']
  assert quoted('Zoology (Arora et al. 2023) at 1e-3, width 64, (128, 8)') == []
  assert quoted('1,568.0 KiB, 0.013-0.021, 1.01x, jax 0.10.2') == [
    '1568.0',
    '0.013',
    '0.021',
    '1.01',
  ]


def test_a_stale_table_is_found_and_rewritten_between_the_markers(tmp_path, monkeypatch):
  monkeypatch.setattr(tables, 'ROOT', str(tmp_path))
  (tmp_path / 'doc.md').write_text(f'head\n{tables.START}\nold\n{tables.END}\ntail\n')
  assert tables.update('doc.md', 'new')
  assert (tmp_path / 'doc.md').read_text() == f'head\n{tables.START}\nnew\n{tables.END}\ntail\n'
  assert not tables.update('doc.md', 'new')
  with pytest.raises(ValueError, match='no .* markers'):
    tables.current('no markers here', 'doc.md')


def test_the_template_checks_find_a_long_sentence_and_a_missing_section():
  long = ' '.join(['Word'] + ['word'] * 49)
  assert [len(s.split()) for s in sentences(f'Short one. {long}.')] == [2, 50]
  text = (
    '# T\n\n## Question\n\nQ?\n\n| a | b |\n\n```\ncode ' + long + '\n```\n- a bullet\n  goes on\n'
  )
  assert prose(text) == ['Q?', 'a bullet goes on']
  assert bullets('- one\n  more\n- two\n') == ['one more', 'two']

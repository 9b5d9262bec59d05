"""studies/hygiene.py, the linter step's doc check: no path of this machine in a tracked text
file, no dated run log in a study's write-up, no oversized file under docs/ or studies/."""

import os
import re

import pytest

from studies import hygiene

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOME_ROOT = '/' + 'root'  # spelled in two pieces, so that this file names no home folder


def test_the_tree_has_no_problem():
  assert hygiene.problems() == []


def test_the_readme_lint_step_runs_the_check():
  with open(os.path.join(ROOT, 'README.md')) as f:
    command = re.search(
      r'^Run the linter and the tests.*?```bash\n(.*?)\n```', f.read(), re.M | re.S
    ).group(1)
  steps = command.split(' && ')
  assert '.venv/bin/python -m studies.hygiene' in steps[1:-1], steps  # a lint step
  assert steps[0].startswith('.venv/bin/ruff') and 'pytest' in steps[-1]
  assert {'.venv/bin/ruff format --check .', '.venv/bin/mypy'} <= set(steps[1:-1]), steps


def _tree(root, files):
  for path, text in files.items():
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(text) if isinstance(text, bytes) else full.write_text(text)
  return sorted(files)


def _named(found):
  """{'path:line'} of the problems."""
  return {':'.join(p.split(':')[:2]) for p in found}


def test_machine_paths_are_named_where_they_are_records(tmp_path):
  checkout, home = tmp_path / 'checkout', tmp_path / 'me'
  paths = _tree(
    checkout,
    {
      'docs/guide.md': f'see {tmp_path}/runs/x\n--workdir=/tmp/run is an example\n',
      'main.py': f'# {HOME_ROOT}/x\n# /home/' + 'alice/y\n' + f'# {home}/z\n# /tmp/scratch\n',
      'run.sh': 'ROOT=${ROOT:-/tmp/recall}\n',
      'docs/results/r.md': 'command: --out=/tmp/D/res\n',
      'studies/s/README.md': '--root=/tmp/x\nruns/x ../shared/data ~/.cache a/tmp/b\n',
      'studies/s/data.json': f'"{tmp_path}/runs/x"',  # a record too (issue 70, item 7)
    },
  )
  found = hygiene.problems(str(checkout), paths, home=str(home))
  assert _named(found) == {
    'docs/guide.md:1',
    'main.py:1',
    'main.py:2',
    'main.py:3',
    'docs/results/r.md:1',
    'studies/s/README.md:1',
    'studies/s/data.json:1',
  }, found
  assert all('names a path of this machine' in p for p in found)


def test_a_record_names_no_absolute_path_wherever_the_clone_lies(tmp_path):
  """Records written on a machine whose checkout sat in /scratch named /scratch/runs/...: a clone
  in another folder saw nothing wrong, and a .json record was not read at all (issue 70,
  item 7). Any absolute path in a record (.md or .json under docs/results/ or studies/) is
  now named; guides and tests keep their example folders, URLs are not paths."""
  paths = _tree(
    tmp_path / 'clone',
    {
      'docs/results/r.json': '{\n "out": "/scratch/runs/lra34/p3072",\n "n": 1.5\n}\n',
      'docs/results/r.md': 'command: --out=/scratch/runs/lra34/p3072\n',
      'studies/s/s.json': '["/tmp/D/res/x.png", "runs/res/x.png"]\n',
      'studies/s/s.md': 'see https://github.com/a/b/blob/x.py and ../runs/a/b\n',
      'docs/configs.md': '--config.dataset.data_dir=/data/tfds\n',
      'tests/recorded.json': '["base=/scratch/base"]\n',
    },
  )
  found = hygiene.problems(str(tmp_path / 'clone'), paths, home='')
  assert _named(found) == {'docs/results/r.json:2', 'docs/results/r.md:1', 'studies/s/s.json:1'}
  assert all('names a path of this machine (/' in p for p in found), found


def test_a_parent_that_is_the_filesystem_root_forbids_nothing(tmp_path):
  patterns = hygiene.machine_patterns('/checkout', home='')
  assert not any(p.search('/usr/lib/x') for p in patterns)


def test_a_clone_in_a_temporary_folder_keeps_tmp_examples_legal():
  """CI clones into a folder such as /tmp/fresh: its parent, /tmp, is every machine's, so
  '/tmp/x' examples in code and guides stay legal (records keep their own /tmp rule)."""
  patterns = hygiene.machine_patterns('/tmp/fresh', home='')
  assert not any(p.search('--workdir=/tmp/run') for p in patterns)
  assert hygiene.path_problems('docs/results/r.md', '--out=/tmp/D\n', patterns)


def test_dated_lines_are_named_in_a_study_but_not_in_its_runlog_or_a_report_header(tmp_path):
  paths = _tree(
    tmp_path,
    {
      'studies/s/README.md': 'ran on 2026-11-28\nfrom 14:05 UTC on\nsteps 1,500-2,000\n',
      'studies/s/report.md': 'Measured on: cpu, jax 0.10.2, 2026-11-25T03:26:47+00:00\n',
      'studies/s/RUNLOG.md': '2026-11-28 14:05 UTC: seed 0\n',
      'studies/s/sweep.py': '# 2026-11-28\n',
      'docs/guide.md': 'measured on 2026-11-23\n',
    },
  )
  found = hygiene.problems(str(tmp_path), paths, home='')
  assert _named(found) == {'studies/s/README.md:1', 'studies/s/README.md:2'}, found
  assert all('dated run-log line' in p for p in found)


def test_files_over_the_limit_are_named_under_docs_and_studies(tmp_path):
  limit = hygiene.LIMIT_BYTES
  paths = _tree(
    tmp_path,
    {
      'studies/s/big.png': b'x' * (limit + 1),
      'docs/results/at_limit.json': b'x' * limit,
      'tests/big.bin': b'x' * (limit + 1),
    },
  )
  found = hygiene.problems(str(tmp_path), paths, home='')
  assert [p.split(':')[0] for p in found] == ['studies/s/big.png'], found
  assert f'over the {limit // 1024} KB limit' in found[0]


def test_main_fails_when_there_is_a_problem(monkeypatch, capsys):
  monkeypatch.setattr(hygiene, 'problems', lambda: ['a.md:1: names a path of this machine'])
  assert hygiene.main() == 1
  assert capsys.readouterr().out == 'a.md:1: names a path of this machine\n'
  monkeypatch.setattr(hygiene, 'problems', lambda: [])
  assert hygiene.main() == 0


@pytest.mark.parametrize(
  'arg,want',
  [
    ('{parent}/runs/recall/seed*', '../runs/recall/seed*'),
    ('--root={parent}/runs/x', '--root=../runs/x'),
    ('{checkout}/studies/recall/recall_d.json', 'studies/recall/recall_d.json'),
    ('{home}/.cache/x', '~/.cache/x'),
    ('runs/x', 'runs/x'),
    ('/tmp/elsewhere', '/tmp/elsewhere'),  # left for the check to name
  ],
)
def test_a_record_names_a_run_folder_relative_to_the_checkout(tmp_path, arg, want):
  checkout, home = tmp_path / 'checkout', '/' + 'nohome/me'
  arg = arg.format(parent=tmp_path, checkout=checkout, home=home)
  assert hygiene.portable(arg, str(checkout), home=home) == want

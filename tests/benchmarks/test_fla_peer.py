"""benchmarks.fla_peer and benchmarks.published.fla: refusals, the hash check, a dry run."""

import json
import os
import re
import subprocess

import pytest

from benchmarks import fla_peer
from benchmarks import fla_peer_ours
from benchmarks.published import fla

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
  'flag,message',
  [
    ('--recurrences=mamba3', "--recurrences='mamba3' is not valid; valid values: retention"),
    ('--dtypes=float8', "--dtypes='float8' is not valid; valid values: bfloat16, float32"),
    ('--implementations=triton', "--implementations='triton' is not valid"),
    ('--batch=0', '--batch=0 is not valid; it must be >= 1'),
    ('--lengths=0', "--lengths='0' is not valid; every length must be >= 1"),
  ],
)
def test_bad_flags_are_one_line_before_anything_is_written(tmp_path, flag, message):
  with pytest.raises(SystemExit) as e:
    fla_peer.main([flag, f'--out={tmp_path}'])
  assert str(e.value).startswith(f'Error: {message}') and '\n' not in str(e.value)
  assert not os.listdir(tmp_path)


def _fake_fla(root, text='x = 1\n'):
  os.makedirs(os.path.join(root, 'fla', 'ops'))
  with open(os.path.join(root, 'fla', 'ops', '__init__.py'), 'w') as f:
    f.write(text)


def test_fla_is_refused_unless_its_tree_is_the_published_one(tmp_path, monkeypatch):
  monkeypatch.setenv(fla.FLA['env'], str(tmp_path))
  assert fla.why_missing().startswith(f"fla's source is not at {tmp_path}")
  _fake_fla(tmp_path)
  reason = fla.why_missing()
  assert 'not the published tree' in reason and fla.FLA['commit'] in reason
  # The tree hash reads contents and paths, not how the files were unpacked.
  before = fla.tree_sha256(str(tmp_path / 'fla'))
  os.makedirs(tmp_path / 'fla' / '__pycache__')
  (tmp_path / 'fla' / '__pycache__' / 'x.pyc').write_bytes(b'\0')
  assert fla.tree_sha256(str(tmp_path / 'fla')) == before
  (tmp_path / 'fla' / 'ops' / '__init__.py').write_text('x = 2\n')
  assert fla.tree_sha256(str(tmp_path / 'fla')) != before
  with pytest.raises(RuntimeError, match='not the published tree'):
    fla.ops()


def test_a_dry_run_times_ours_and_skips_fla_in_one_line(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv(fla.FLA['env'], str(tmp_path / 'nowhere'))
  fla_peer.main(
    [
      '--dry_run',
      '--recurrences=gated_deltanet',
      '--implementations=xla',
      '--dtypes=float32',
      '--layouts=heads',
      f'--out={tmp_path}',
      '--name=t',
    ]
  )
  printed = capsys.readouterr().out
  assert re.search(r"^fla skipped: fla's source is not at .*nowhere", printed, re.M)
  data = json.loads((tmp_path / 't.json').read_text())
  assert [r['length'] for r in data['rows']] == [64, 96]
  assert all(r['xla_float32']['time_s'] > 0 for r in data['rows'])
  assert data['rows'][0]['decode_ours_s'] > 0 and data['fla']['skipped']
  assert '| gated_deltanet | heads | 1 x 64 x 2 x (16, 16) |' in (tmp_path / 't.md').read_text()


def test_every_point_skipped_exits_non_zero(tmp_path, monkeypatch):
  monkeypatch.setattr(fla_peer_ours, 'our_core', lambda recurrence, implementation: None)
  monkeypatch.setenv(fla.FLA['env'], str(tmp_path / 'nowhere'))
  with pytest.raises(SystemExit, match='every point failed or was skipped'):
    fla_peer.main(
      [
        '--dry_run',
        '--recurrences=retention',
        '--implementations=xla',
        '--dtypes=float32',
        '--layouts=heads',
        '--nodecode',
        f'--out={tmp_path}',
      ]
    )


def test_the_gpu_suite_runs_the_fla_parts_by_default():
  """The parts the suite runs when PARTS is unset exist in it, in that order, and the usage
  error is one line."""
  script = open(os.path.join(ROOT, 'benchmarks', 'gpu_suite.sh')).read()
  default = re.search(r'PARTS=\$\{PARTS-"([^"]+)"\}', script).group(1).split()
  assert default[:3] == ['nvidia_smi', 'env', 'fla_peer']
  defined = re.findall(r'^part (\w+)', script, re.M)
  assert [p for p in defined if p in default] == default
  proc = subprocess.run(
    ['bash', 'benchmarks/gpu_suite.sh', '--bogus'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=30,
    env=dict(os.environ, OUT='/dev/null'),
  )
  assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr

"""benchmarks.fla_peer and benchmarks.published.fla: refusals, the hash check, fla's layout
of the inputs against ours, a dry run."""

import json
import os
import re
import subprocess

import numpy as np
import pytest

from benchmarks import fla_peer
from benchmarks import fla_peer_fla
from benchmarks import fla_peer_inputs
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


def _fla_reference(recurrence, x, *, step):
  """fla's naive recurrences (fla/ops/*/naive.py; scale 1) in float64 on `fla_inputs`'s
  arrays: KDA's and the gated delta rule's (decay, then the delta write), Gated
  DeltaProduct's (a decay, then num_householder delta steps a token, the query read after
  the last) and the DPLR rule's (S = exp(w) S + k v^T + b (a^T S))."""
  x = {
    name: np.asarray(value, np.float64) for name, value in x.items() if name != 'num_householder'
  }
  q = x.get('q', x.get('r'))
  b, n, h, dk = q.shape
  s = np.zeros((b, h, dk, x['v'].shape[-1]))
  outs = []
  if recurrence == 'rwkv7':
    for t in range(n):
      removed = np.einsum('bhk,bhkv->bhv', x['a'][:, t], s)
      s = np.exp(x['w'][:, t])[..., None] * s
      s = s + np.einsum('bhk,bhv->bhkv', x['b'][:, t], removed)
      s = s + np.einsum('bhk,bhv->bhkv', x['k'][:, t], x['v'][:, t])
      outs.append(np.einsum('bhk,bhkv->bhv', x['r'][:, t], s))
    return np.stack(outs, 1)
  n_h = x['k'].shape[1] // n if recurrence == 'gated_deltaproduct' and not step else 1
  g = x['g'] if x['g'].ndim == 4 else x['g'][..., None]
  for t in range(n):
    s = np.exp(g[:, t])[..., None] * s
    for j in range(t * n_h, (t + 1) * n_h):
      k_j, beta_j = x['k'][:, j], x['beta'][:, j]
      u = beta_j[..., None] * (x['v'][:, j] - np.einsum('bhkv,bhk->bhv', s, k_j))
      s = s + np.einsum('bhk,bhv->bhkv', k_j, u)
    outs.append(np.einsum('bhk,bhkv->bhv', q[:, t], s))
  return np.stack(outs, 1)


@pytest.mark.parametrize('recurrence', ['kda', 'gated_deltaproduct', 'rwkv7'])
def test_fla_reads_the_inputs_as_the_same_math_as_ours(recurrence):
  """fla's op on `fla_inputs` (its naive recurrence, float64) equals our chunk form on the
  inputs themselves: the same decays, betas and pairs, Gated DeltaProduct's substeps in
  fla's order (its chunk op's layout and its layer's decoding one)."""
  s = fla_peer_inputs.shapes(recurrence, 'heads', 2, 8)
  data = fla_peer_inputs.inputs(recurrence, 1, 12, s, seed=1)
  ours, _ = fla_peer_ours.our_core(recurrence, 'xla')(*data, chunk_size=8)
  ours = np.asarray(ours, np.float64)
  for step in (False, True):
    x = fla_peer_fla.fla_inputs(recurrence, *data, step=step)
    fla = _fla_reference(recurrence, x, step=step)
    if step and recurrence == 'gated_deltaproduct':  # fla's layer reads each token's last
      n_h = s['num_householder']
      fla = fla[:, n_h - 1 :: n_h]
      assert 'num_householder' not in x
    np.testing.assert_allclose(ours, fla, rtol=2e-4, atol=2e-4, err_msg=f'step={step}')
  if recurrence == 'gated_deltaproduct':
    assert fla_peer_fla.fla_inputs(recurrence, *data)['num_householder'] == 2


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


def test_every_recurrence_has_its_rows_and_rwkv7_skips_pallas(tmp_path, monkeypatch):
  """Every recurrence's rows in a dry run (the timing faked: no compile), RWKV-7's 'pallas'
  cells skipped with the reason, Gated DeltaProduct's steps a token in the table."""
  monkeypatch.setenv(fla.FLA['env'], str(tmp_path / 'nowhere'))
  monkeypatch.setattr(fla_peer_ours, 'time_ours', lambda *a, **kw: dict(time_s=1e-3))
  monkeypatch.setattr(fla_peer_ours, 'time_our_step', lambda *a, **kw: 1e-6)
  fla_peer.main(
    ['--dry_run', '--layouts=heads', '--dtypes=float32', f'--out={tmp_path}', '--name=t', '--quiet']
  )
  rows = {
    (r['recurrence'], r['length']): r for r in json.loads((tmp_path / 't.json').read_text())['rows']
  }
  assert sorted(rows) == sorted((r, n) for r in fla_peer.RECURRENCES for n in (64, 96))
  assert {'kda', 'gated_deltaproduct', 'rwkv7'} <= set(fla_peer.RECURRENCES)
  for (recurrence, _), row in rows.items():
    assert row['xla_float32'] == dict(time_s=1e-3)
    pallas = {'skipped': 'rwkv7 has no pallas form (no kernel)'} if recurrence == 'rwkv7' else None
    assert row['pallas_float32'] == (pallas or dict(time_s=1e-3)), recurrence
  table = (tmp_path / 't.md').read_text()
  assert '| gated_deltaproduct | heads | 1 x 64 x 2 x (16, 16), n_h 2 | 1 | 1 | 1.0 | - |' in table
  assert '| rwkv7 | heads | 1 x 96 x 2 x (16, 16) | skipped | 1 | - | - |' in table


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

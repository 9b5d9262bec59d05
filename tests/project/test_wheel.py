"""The library wheel installs alone: only `efficient_attn`, needing only jax, flax, numpy.

The wheel is built from a copy of the package (the repository is left as it
is), checked, and installed into a fresh virtual environment with pip, offline:
the environment sees only the distributions the wheel's requirements pull in
(their closure, resolved from this environment's metadata), so a hidden need
for TensorFlow, ml_collections or the experiment code makes the layer fail there.
"""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile

from packaging import requirements
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY_REQUIRES = {'jax', 'flax', 'numpy'}

LAYER = r'''
import importlib.util
import jax, jax.numpy as jnp
import efficient_attn as ea
for name in ('tensorflow', 'tensorflow_datasets', 'ml_collections', 'data', 'train',
             'configs', 'benchmarks'):
  assert importlib.util.find_spec(name) is None, f'{name} is importable'
layer = ea.MultiHeadAttention(num_heads=2, mechanism='linear', projection='efficient')
x = jnp.ones((1, 8, 16))
params = layer.init(jax.random.key(0), x)
y = layer.apply(params, x)
assert y.shape == (1, 8, 16) and bool(jnp.isfinite(y).all())
print('layer ok', ea.__file__)
'''


def _name(requirement) -> str:
  return requirement.name.lower().replace('_', '-')


def closure(roots):
  """{name: Distribution} of `roots` and everything they require here (markers, extras)."""
  found, todo = {}, [(r, ()) for r in roots]
  while todo:
    name, extras = todo.pop()
    dist = importlib.metadata.distribution(name)
    key = dist.metadata['Name'].lower().replace('_', '-')
    seen = key in found
    found[key] = dist
    for line in dist.requires or ():
      req = requirements.Requirement(line)
      envs = [{'extra': e} for e in extras] or [{'extra': ''}]
      if req.marker is None or any(req.marker.evaluate(env) for env in envs):
        if not seen or extras:
          todo.append((_name(req), tuple(req.extras)))
  return found


def link_distributions(dists, site, out):
  """Symlinks every top-level file or folder of `dists` from `site` into `out`."""
  os.makedirs(out, exist_ok=True)
  for dist in dists.values():
    for file in dist.files or ():
      top = file.parts[0]
      source = os.path.join(site, top)
      if top != '..' and os.path.exists(source) and not os.path.exists(os.path.join(out, top)):
        os.symlink(source, os.path.join(out, top))


@pytest.mark.slow
def test_wheel_has_only_the_library_and_installs_alone(tmp_path):
  source = tmp_path / 'src'
  source.mkdir()
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(os.path.join(ROOT, name), source / name)
  shutil.copytree(
    os.path.join(ROOT, 'efficient_attn'),
    source / 'efficient_attn',
    ignore=shutil.ignore_patterns('__pycache__'),
  )
  subprocess.run(
    [
      sys.executable,
      '-m',
      'pip',
      'wheel',
      '--no-deps',
      '--no-build-isolation',
      '--no-index',
      '-q',
      '-w',
      str(tmp_path / 'dist'),
      str(source),
    ],
    check=True,
  )
  (wheel,) = (tmp_path / 'dist').glob('efficient_attn-*.whl')

  with zipfile.ZipFile(wheel) as z:
    tops = {n.split('/')[0] for n in z.namelist()}
    (meta,) = [n for n in z.namelist() if n.endswith('.dist-info/METADATA')]
    metadata = z.read(meta).decode()
  assert {t for t in tops if not t.endswith('.dist-info')} == {'efficient_attn'}, tops
  requires = [
    requirements.Requirement(line.split(':', 1)[1].strip())
    for line in metadata.splitlines()
    if line.startswith('Requires-Dist:')
  ]
  library = {_name(r) for r in requires if r.marker is None}
  assert library == LIBRARY_REQUIRES, library

  # A fresh environment that can see only what the library's requirements pull in.
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
  python = str(venv / 'bin' / 'python')
  site = subprocess.run(
    [python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
    check=True,
    capture_output=True,
    text=True,
  ).stdout.strip()
  dists = closure(sorted(LIBRARY_REQUIRES))
  assert not {'tensorflow', 'tensorflow-cpu', 'tensorflow-datasets'} & set(dists), sorted(dists)
  here = os.path.dirname(
    os.path.dirname(importlib.metadata.distribution('jax').locate_file('jax/__init__.py'))
  )
  link_distributions(dists, here, str(tmp_path / 'deps'))
  with open(os.path.join(site, 'deps.pth'), 'w') as f:
    f.write(str(tmp_path / 'deps') + '\n')
  # pip resolves the requirements against what the environment has, offline.
  subprocess.run([python, '-m', 'pip', 'install', '--no-index', '-q', str(wheel)], check=True)
  installed = subprocess.run(
    [python, '-m', 'pip', 'list', '--format=freeze'], check=True, capture_output=True, text=True
  ).stdout.lower()
  assert 'tensorflow' not in installed and 'efficient-attn==' in installed

  work = tmp_path / 'elsewhere'  # not the repository: its folders must not be importable
  work.mkdir()
  result = subprocess.run(
    [python, '-c', LAYER],
    cwd=work,
    capture_output=True,
    text=True,
    env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'},
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'layer ok' in result.stdout and str(venv) in result.stdout

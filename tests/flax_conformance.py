"""Runs flax's own attention tests with our layers in place of flax's.

    python tests/flax_conformance.py [linen|nnx ...] [-- pytest args]

Flax's test files are not copied into this repository: they are read from the
source distribution of the installed flax version (downloaded once from the
package index with `pip download`, then cached), and run unchanged by pytest
with a `conftest.py` that puts `efficient_attn.MultiHeadAttention` (mechanism
'softmax') where `flax.linen.MultiHeadDotProductAttention` and
`flax.linen.MultiHeadAttention` were, or `efficient_attn.nnx.MultiHeadAttention`
where `flax.nnx.MultiHeadAttention` was. The NNX file's Linen reference layer
stays flax's own, so there our NNX layer is compared with flax's Linen layer.
"""

import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

import flax
import main_runner

SUITES = {
  'linen': 'tests/linen/linen_attention_test.py',
  'nnx': 'tests/nnx/nn/attention_test.py',
}

_CONFTEST = '''
import flax.linen
import flax.nnx
import efficient_attn
import efficient_attn.nnx

SUITE = {suite!r}

if SUITE == 'linen':
  class MultiHeadDotProductAttention(efficient_attn.MultiHeadAttention):
    """Ours, under flax's class name (Linen names submodules after the class)."""

  flax.linen.MultiHeadDotProductAttention = MultiHeadDotProductAttention
  flax.linen.MultiHeadAttention = efficient_attn.MultiHeadAttention
else:
  flax.nnx.MultiHeadAttention = efficient_attn.nnx.MultiHeadAttention
'''


def _cache_dir() -> pathlib.Path:
  root = os.environ.get('XDG_CACHE_HOME', os.path.expanduser('~/.cache'))
  return pathlib.Path(root) / 'efficient_attn' / f'flax-{flax.__version__}'


def flax_test_file(suite: str) -> pathlib.Path:
  """Flax's test file for `suite`, from the installed version's sdist (downloaded once)."""
  cache = _cache_dir()
  target = cache / SUITES[suite]
  if target.exists():
    return target
  cache.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    subprocess.run(
      [
        sys.executable,
        '-m',
        'pip',
        'download',
        '--quiet',
        '--no-deps',
        '--no-binary',
        ':all:',
        '--dest',
        tmp,
        f'flax=={flax.__version__}',
      ],
      check=True,
    )
    (sdist,) = pathlib.Path(tmp).glob('flax-*.tar.gz')
    with tarfile.open(sdist) as tar:
      for path in SUITES.values():
        member = tar.getmember(f'flax-{flax.__version__}/{path}')
        data = tar.extractfile(member).read()
        (cache / path).parent.mkdir(parents=True, exist_ok=True)
        (cache / path).write_bytes(data)
  return target


def run(suite: str, pytest_args=()) -> subprocess.CompletedProcess:
  """pytest on flax's `suite` file with our layer substituted; returns the finished process."""
  source = flax_test_file(suite)
  work = pathlib.Path(tempfile.mkdtemp(prefix=f'flax_{suite}_'))
  (work / 'conftest.py').write_text(_CONFTEST.format(suite=suite))
  (work / source.name).write_text(source.read_text())
  repo = pathlib.Path(__file__).resolve().parent.parent
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(
      [str(repo)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
    ),
  )
  # Hundreds of small eager kernels: the tests' compile flags cut the run several times
  # over (both sides of every comparison run in this one process, under the same flags).
  env.setdefault('XLA_FLAGS', main_runner.XLA_FLAGS)
  env.pop('PYTEST_ADDOPTS', None)
  env.pop('PYTEST_XDIST_WORKER', None)
  return subprocess.run(
    [
      sys.executable,
      '-m',
      'pytest',
      '-q',
      '-p',
      'no:cacheprovider',
      '--rootdir',
      str(work),
      str(work / source.name),
      *pytest_args,
    ],
    cwd=work,
    env=env,
    capture_output=True,
    text=True,
  )


def main(argv) -> int:
  args, pytest_args = (
    (argv[: argv.index('--')], argv[argv.index('--') + 1 :]) if '--' in argv else (argv, [])
  )
  status = 0
  for suite in args or list(SUITES):
    done = run(suite, pytest_args)
    print(done.stdout[-6000:], done.stderr[-2000:], sep='\n')
    status |= done.returncode
  return status


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))

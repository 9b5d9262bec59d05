"""flash-linear-attention (fla), run as published: the peer of the gated family's kernels.

fla (github.com/fla-org/flash-linear-attention, MIT licence, Copyright 2023-2026 Songlin
Yang, Yu Zhang, Zhiyuan Li) is PyTorch with Triton kernels. `benchmarks.fla_peer` times
its chunk kernels beside ours on a GPU. Its source is not part of this repository:
third-party code stays out of its commits. It is read from `FLA['local']` (git-ignored:
a folder holding fla's `fla/` package, as published at `FLA['commit']`) or from the folder
named by the environment variable `EFFICIENT_ATTN_FLA`, and refused unless its tree hash
(`tree_sha256`: the sha256 of each file's path and sha256, sorted) is `FLA['tree_sha256']`,
so what runs is exactly the published code. To get it:

    git clone https://github.com/fla-org/flash-linear-attention /tmp/fla
    mkdir -p benchmarks/published/third_party/fla
    git -C /tmp/fla archive <commit> fla LICENSE | tar -x -C benchmarks/published/third_party/fla
    python -m benchmarks.published.fla        # checks it: one line

fla needs torch, triton, einops and transformers (a GPU machine's image has them).
"""

import hashlib
import importlib
import os
import sys
from typing import Any, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))

FLA = dict(
  repo='fla-org/flash-linear-attention',
  commit='bc3b101dcb713ddc5bd8924b66754eb68b5ccf89',  # 2026-08-22, version 0.5.2
  license='MIT',
  local=os.path.join(_HERE, 'third_party', 'fla'),
  env='EFFICIENT_ATTN_FLA',
)
# `tree_sha256` of `fla/` at FLA['commit'] (the package folder, every file).
FLA['tree_sha256'] = '5ae93ee280e558842c1c383ee679c5347e3d7b01f9c86f90374c75cd6a17d1ab'


def fla_root() -> str:
  """The folder holding the `fla` package."""
  return os.environ.get(FLA['env']) or FLA['local']


def tree_sha256(folder: str) -> str:
  """sha256 over `<path relative to folder>\\0<file sha256>\\n` of every file under
  `folder`, sorted by path (`__pycache__` folders left out): the same for the same files
  however they were unpacked."""
  lines = []
  for top, dirs, files in os.walk(folder):
    dirs[:] = sorted(d for d in dirs if d != '__pycache__')
    for name in files:
      path = os.path.join(top, name)
      with open(path, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
      lines.append(f'{os.path.relpath(path, folder)}\0{digest}\n')
  return hashlib.sha256(''.join(sorted(lines)).encode()).hexdigest()


def why_missing() -> Optional[str]:
  """One line saying why fla cannot run here, or None when it can."""
  package = os.path.join(fla_root(), 'fla')
  if not os.path.isdir(package):
    return (
      f"fla's source is not at {package}: unpack fla/ of {FLA['repo']} at "
      f"{FLA['commit']} into {fla_root()} (or name the folder in ${FLA['env']})"
    )
  digest = tree_sha256(package)
  if digest != FLA['tree_sha256']:
    return (
      f'{package} has tree sha256 {digest}, not the published tree\'s '
      f"{FLA['tree_sha256']} ({FLA['repo']} at {FLA['commit']})"
    )
  for module in ('torch', 'triton', 'einops', 'transformers'):
    if importlib.util.find_spec(module) is None:
      return f'fla needs {module}, which is not installed'
  import torch  # pylint: disable=g-import-not-at-top

  if not torch.cuda.is_available():
    return 'fla runs on a GPU: torch sees none'
  return None


def ops() -> Any:
  """fla's `fla.ops`, imported from the checked published tree. RuntimeError (one line,
  `why_missing`) where it cannot run."""
  reason = why_missing()
  if reason:
    raise RuntimeError(reason)
  root = fla_root()
  if root not in sys.path:
    sys.path.insert(0, root)
  return importlib.import_module('fla.ops')


if __name__ == '__main__':
  print(why_missing() or f"fla {FLA['commit'][:12]} at {fla_root()}: ready")

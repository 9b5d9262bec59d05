"""Whether a checkpoint step can be trusted, and what becomes of one that cannot.

    record = manifest(tree)                      # {path: [shape, dtype, crc32]}
    want, damage = check_files(directory, step)  # its manifest, or why its files are damaged
    damage = verify(want, restored)              # after Orbax restored its arrays
    where = set_aside(directory, step)           # to <workdir>/damaged_checkpoints/

Each save records a manifest, `checkpoints/<step>.manifest.json`, with the shape, dtype
and CRC-32 of every array. A step is trusted when its manifest is whole, Orbax can read
its `_CHECKPOINT_METADATA`, and its restored arrays match the manifest and are finite. A
damaged step is never deleted: the trainer moves it, folder and manifest, to
`<workdir>/damaged_checkpoints/<step>` (`<step>.2`, ... when that name is taken) before
it trains and saves that step again, so it can be repaired or inspected later.
"""

import json
from typing import Any, Dict, Optional, Tuple
import zlib

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
from orbax.checkpoint._src.metadata import step_metadata_serialization

from train import mesh as mesh_lib
from train.workdir import layout

ITEMS = ('params', 'opt_state')
DAMAGED = layout.DAMAGED_CHECKPOINTS


@jax.jit
def _all_finite(tree) -> jnp.ndarray:
  leaves = [
    jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)
  ]
  return jnp.stack(leaves).all() if leaves else jnp.bool_(True)


def all_finite(tree) -> bool:
  return bool(_all_finite(tree))


def manifest(tree) -> Dict[str, list]:
  """{path: [shape, dtype, crc32]} of every array of `tree` (fetched to the host; arrays
  sharded across processes are gathered, so every process must call it)."""
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(mesh_lib.gathered(tree))[0]:
    x = np.ascontiguousarray(x)
    out[jax.tree_util.keystr(path)] = [list(x.shape), str(x.dtype), zlib.crc32(x.tobytes())]
  return out


def manifest_path(directory: epath.Path, step: int) -> epath.Path:
  """`<directory>/<step>.manifest.json`, beside the step's folder."""
  return directory / f'{step}.manifest.json'


def check_files(directory: epath.Path, step: int) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
  """(the manifest of `step`, None), or (None, why the files that describe it are missing or
  damaged); read before its arrays. The manifest must be there and whole (a step is never
  trusted without its check), and its `_CHECKPOINT_METADATA` what Orbax reads."""
  path = manifest_path(directory, step)
  try:
    text = path.read_text()
  except FileNotFoundError:
    return None, f'its manifest {path.name} is missing (the save did not complete)'
  except OSError as e:
    return None, f'its manifest {path.name} cannot be read ({e.strerror or e})'
  try:
    want = json.loads(text) if text.strip() else None
  except ValueError as e:
    return None, f'its manifest {path.name} is not valid JSON ({e})'
  if not isinstance(want, dict) or not all(isinstance(want.get(n), dict) for n in ITEMS):
    return None, f'its manifest {path.name} is {"empty" if not text.strip() else "not a manifest"}'
  path = directory / str(step) / '_CHECKPOINT_METADATA'
  try:
    metadata = json.loads(path.read_text())
    if not isinstance(metadata, dict):
      raise ValueError(f'a JSON {type(metadata).__name__}, not an object')
    step_metadata_serialization.deserialize(metadata)
  except FileNotFoundError:
    return None, f'its Orbax metadata {path.name} is missing'
  except Exception as e:  # pylint: disable=broad-except  (what Orbax raises reading it)
    text = str(e).strip().splitlines()[0] if str(e).strip() else ''
    return None, f'its Orbax metadata {path.name} cannot be read ({type(e).__name__}: {text})'
  return want, None


def verify(want: Dict[str, Any], restored: Dict[str, Any]) -> Optional[str]:
  """Why the restored arrays (item name -> tree) are damaged, or None if they are sound:
  each must be in the manifest `want` with the recorded checksum, the params finite."""
  for name, tree in restored.items():
    got = manifest(tree)
    missing = sorted(set(got) ^ set(want[name]))
    if missing:
      return f'{name}{missing[0]} is not in both the checkpoint and its manifest'
    bad = [k for k in want[name] if got[k] != want[name][k]]
    if bad:
      return f'{name}{bad[0]} does not match its recorded checksum'
  if not all_finite(restored['params']):
    return 'its parameters are not finite'
  return None


def set_aside(directory: epath.Path, step: int) -> epath.Path:
  """Moves the folder and manifest of `step` from `directory` (`<workdir>/checkpoints`) to
  `<workdir>/damaged_checkpoints/<step>` (`<step>.2`, ... if taken); returns the folder.

  The manifest goes first: a move cut short leaves the folder without one, which is
  damage, set aside again by the next run; nothing is lost either way."""
  aside = directory.parent / DAMAGED
  aside.mkdir(parents=True, exist_ok=True)
  name, copies = str(step), 1
  while (aside / name).exists() or manifest_path(aside, name).exists():
    copies += 1
    name = f'{step}.{copies}'
  record = manifest_path(directory, step)
  if record.exists():
    record.rename(manifest_path(aside, name))
  (directory / str(step)).rename(aside / name)
  return aside / name


def untrusted(directory: epath.Path, steps) -> str:
  """`directory`'s checkpoints at `steps`, every one damaged, in words."""
  steps = sorted(steps)
  which = f'steps {", ".join(map(str, steps))} are' if len(steps) > 1 else f'step {steps[0]} is'
  return f'no sound checkpoint in {directory}: {which} damaged (the warnings above say why)'

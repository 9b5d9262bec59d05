"""A workdir's identity: the config that made it.

`config.json` is the workdir's identity. A config whose fields differ from the
stored ones, other than those in `MAY_CHANGE`, is refused before anything is
written: the message names the fields and says how to go on (a new workdir, or
`--restart`, which moves the old run aside, never deletes it).
"""

import json
from typing import Any, Dict, List, Optional

from etils import epath
import ml_collections

from efficient_attn.layers import hybrid
from train.workdir import errors
from train.workdir import layout

# Fields that may change when a run is resumed or evaluated: they change how
# long it runs, how often it reports, where data or outputs are and how it is
# laid out over the devices (a checkpoint restores onto any mesh), not what
# model it trains.
MAY_CHANGE = (
  'train.num_steps',
  'train.num_epochs',
  'train.eval_every',
  'train.log_every',
  'train.checkpoint_every',
  'train.keep_checkpoints',
  'train.async_checkpoints',
  'train.mesh',
  'train.fsdp_min_size',
  'dataset.eval_batch_size',
  'dataset.eval_split',
  'dataset.data_dir',
  'dataset.source',
  'dataset.manual_dir',
  'dataset.download',
  'sample',
)


# Fields added to the configs after runs were made, with the value that gives
# the behaviour those runs had: a stored config without the field reads as
# having it, so older workdirs can still be resumed and evaluated.
ADDED_DEFAULTS = {
  'model.positions': 'learned',
  'dataset.num_distractors': None,
  'dataset.packing': False,  # packed rows (0.3.0): runs before it had one window a row
  # mamba2's head layout options (None: each head its own B and C, of
  # head_dim, and the norm over the full width, as before they existed)
  'attention.options.ngroups': None,
  'attention.options.d_state': None,
  # the gated family's initialisation, convolution bias, dt range and
  # kernels (0.2.0): PyTorch's initialisation, no bias (Mamba-2's default
  # is a bias now), Mamba's dt range, the XLA chunk form
  'attention.options.init': 'default',
  'attention.options.conv_bias': False,
  'attention.options.dt_min': 0.001,
  'attention.options.dt_max': 0.1,
  'attention.options.implementation': 'auto',
}

# Fields the data fills in when a run starts (`data.check_splits`), with what a change
# means: compared only where both configs have them (a config resolved without reading
# the data has none; a run stored before the field existed resumes as it did).
FROM_DATA = {
  'dataset.corpus_sha256': 'the text of dataset.corpus changed; builtin:python_docs '
  'is the running Python\'s documentation and changes '
  'with its version'
}


def _flat(tree: Dict[str, Any], prefix: str = '') -> Dict[str, Any]:
  out = {}
  for key, value in tree.items():
    path = f'{prefix}{key}'
    if isinstance(value, dict) and value:
      out.update(_flat(value, path + '.'))
    else:
      out[path] = value
  return out


def may_change(path: str) -> bool:
  """Whether the config field `path` ('train.num_steps') is one of MAY_CHANGE (or in one)."""
  return any(path == f or path.startswith(f + '.') for f in MAY_CHANGE)


def differences(stored: Dict[str, Any], config: Dict[str, Any]) -> List[str]:
  """'field: stored -> new' for every field (outside MAY_CHANGE) that differs; a field of
  ADDED_DEFAULTS missing from the stored config counts as its default, and one of
  FROM_DATA is compared only where both have it."""
  a, b = _flat(stored), _flat(json.loads(json.dumps(config)))
  a.update({k: v for k, v in ADDED_DEFAULTS.items() if k not in a and k in b})
  keys = sorted(
    k
    for k in set(a) | set(b)
    if not may_change(k) and not (k in FROM_DATA and (k not in a or k not in b))
  )
  return [
    f'{k}: {a.get(k, "(absent)")!r} -> {b.get(k, "(absent)")!r}'
    + (f' ({FROM_DATA[k]})' if k in FROM_DATA else '')
    for k in keys
    if a.get(k, '(absent)') != b.get(k, '(absent)')
  ]


def with_added_options(stored: Dict[str, Any]) -> Dict[str, Any]:
  """A stored config with each mechanism option of ADDED_DEFAULTS that it lacks and its
  mechanism declares, at the value the run had: so an older run is rebuilt as it trained
  (a Mamba-2 run from before `conv_bias` has no convolution bias)."""
  attention = stored.get('attention')
  if not isinstance(attention, dict) or 'options' not in attention:
    return stored
  try:
    declared = hybrid.option_defaults(attention['mechanism'])
  except (KeyError, ValueError):  # an unknown mechanism: the config's checks name it
    return stored
  prefix = 'attention.options.'
  for key, value in ADDED_DEFAULTS.items():
    name = key[len(prefix) :]
    if key.startswith(prefix) and name in declared and name not in attention['options']:
      attention['options'][name] = value
  return stored


def load_config(path) -> Optional[ml_collections.ConfigDict]:
  """The config stored in a workdir (options added since it was stored at the values the
  run had: `with_added_options`), or None."""
  file = epath.Path(path) / layout.CONFIG
  if not file.exists():
    return None
  text = file.read_text()
  try:
    return ml_collections.ConfigDict(with_added_options(json.loads(text)))
  except ValueError as e:  # left by an older trainer's interrupted write
    why = e if text.strip() else 'empty'
    raise errors.WorkdirError(
      f"{file}, the run's identity, is damaged ({why}); pass --restart to "
      f'move the run aside and start over'
    ) from None


def check_identity(path, config, *, evaluating: bool = False) -> None:
  """Raises WorkdirError if `path` holds a run of another config."""
  stored = load_config(path)
  if stored is None:
    return
  diffs = differences(stored.to_dict(), config.to_dict())
  if diffs:
    shown = '; '.join(diffs[:6]) + (f'; and {len(diffs) - 6} more' if len(diffs) > 6 else '')
    if evaluating:
      raise errors.WorkdirError(
        f'{path} holds a run of another config, so this config cannot '
        f'evaluate it ({shown}); evaluate with the stored config '
        f'({path}/{layout.CONFIG}), changing only {", ".join(MAY_CHANGE)}'
      )
    raise errors.WorkdirError(
      f'{path} holds a run of another config, so this config cannot continue it ({shown}). '
      f'Use a new --workdir (add --config.init_from={path} to fork: start from its '
      f'weights), or pass --restart to move the old run aside and start over'
    )

"""The run's device mesh: named axes from `config.train.mesh`, and what lives on them.

    spec = mesh.check_spec(config.train.mesh)    # {'data': -1, 'fsdp': 1, 'sequence': 1}
    m = mesh.create(spec)                        # jax.sharding.Mesh ('data', 'fsdp', 'sequence')
    mesh.state_shardings(m, state)               # the FSDP rule, leaf by leaf
    mesh.batch_shardings(m, batch)               # rows over data x fsdp, tokens over 'sequence'

Axes, outermost first:
  data      pure data parallelism: each device a slice of the batch, the state replicated.
  fsdp      data parallelism with the state sharded (ZeRO-3 / FSDP): a slice of the
            batch too, and every leaf of the parameters and optimiser state at least
            `fsdp_min_size` elements long split along its largest axis that the fsdp
            size divides (XLA gathers a leaf where a step needs it whole).
  sequence  context parallelism: each device a block of the sequence; the model's
            layers are built with `sequence_axis='sequence'` and split attention over
            it (`docs/design.md`). Batches shard their token axis over it.
A size of -1 takes the devices the others leave (at most one axis); axes left out are 1,
but 'data' is -1 unless another axis is. The default, {'data': -1, 'fsdp': 1,
'sequence': 1}, is the data parallelism of every device the trainer always had.

The devices are arranged by `jax.make_mesh` (the outer axes across hosts, the inner
within one, on TPU along the physical torus); the axes are `AxisType.Auto`, so XLA
places what the shardings here leave open. The trainer installs the mesh with
`jax.set_mesh` around its compiled steps, where the library's layers find it.
"""

import functools
import math
import numbers
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import jax
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

AXES = ('data', 'fsdp', 'sequence')
DEFAULTS = {'data': -1, 'fsdp': 1, 'sequence': 1}
BATCH_AXES = ('data', 'fsdp')  # the batch's rows are split over these two
SEQUENCE_AXIS = 'sequence'
FSDP_MIN_SIZE = 2**14  # leaves smaller than this stay replicated (norms, biases, scalars)


def _field(spec: Mapping[str, Any]) -> str:
  return f'config.train.mesh={dict(spec)}'


def check_spec(spec: Optional[Mapping[str, Any]]) -> Dict[str, int]:
  """The mesh `config.train.mesh` asks for, every axis named, -1 left unresolved.

  ValueError, one line naming the value and the valid ones, for an unknown axis, a size
  that is not an integer >= 1 or -1, and two axes of -1. Needs no devices: the sizes are
  checked against them in `resolve`.
  """
  given = dict(spec.items()) if spec is not None else {}
  unknown = [name for name in given if name not in AXES]
  if unknown:
    raise ValueError(
      f'{_field(given)} has an unknown axis {unknown[0]!r}; valid axes: {", ".join(AXES)}'
    )
  for name, size in given.items():
    if (
      not isinstance(size, numbers.Integral) or isinstance(size, bool) or (size < 1 and size != -1)
    ):
      raise ValueError(
        f"config.train.mesh['{name}']={size!r} is not valid; it must be an "
        f'integer >= 1, or -1 for the devices the other axes leave'
      )
  spec = {name: given.get(name, DEFAULTS[name]) for name in AXES}
  if 'data' not in given and any(given.get(name) == -1 for name in AXES):
    spec['data'] = 1  # another axis takes the remaining devices
  rest = [name for name in AXES if spec[name] == -1]
  if len(rest) > 1:
    raise ValueError(
      f'{_field(spec)} has -1 in {" and ".join(map(repr, rest))}; at most one '
      f'axis may take the remaining devices'
    )
  return {name: int(size) for name, size in spec.items()}


def resolve(spec: Mapping[str, int], device_count: int) -> Dict[str, int]:
  """`spec` (`check_spec`'s) with -1 filled in for `device_count` devices; ValueError when
  the sizes do not fit them."""
  spec = check_spec(spec)
  fixed = math.prod(size for size in spec.values() if size != -1)
  there = f'{device_count} device' + ('s' if device_count != 1 else '')
  if -1 in spec.values():
    if device_count % fixed:
      raise ValueError(
        f'{_field(spec)} does not fit {there}: the fixed axes '
        f'({fixed} devices) must divide the device count; valid: fixed sizes '
        f'whose product divides {device_count}'
      )
    return {name: device_count // fixed if size == -1 else size for name, size in spec.items()}
  if fixed != device_count:
    raise ValueError(
      f'{_field(spec)} needs {fixed} devices, but there '
      f'{"are" if device_count != 1 else "is"} {there}; valid: sizes whose '
      f'product is {device_count}, or one axis of -1'
    )
  return spec


def create(
  spec: Optional[Mapping[str, Any]] = None, devices: Optional[Sequence[Any]] = None
) -> Mesh:
  """The Mesh ('data', 'fsdp', 'sequence') of `spec` (default: data over every device) over
  `devices` (default: every device of every process), arranged by `jax.make_mesh`."""
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve(DEFAULTS if spec is None else spec, len(devices))
  return jax.make_mesh(
    tuple(shape[name] for name in AXES),
    AXES,
    axis_types=(AxisType.Auto,) * len(AXES),
    devices=devices,
  )


def size(mesh: Mesh, axis: str) -> int:
  """The size of `axis` in `mesh` (1 for an axis it does not have, e.g. a 1-D 'data' mesh)."""
  return int(mesh.shape.get(axis, 1))


def batch_axes(mesh: Mesh) -> Tuple[str, ...]:
  """The mesh axes a batch's rows are split over (those of BATCH_AXES it has)."""
  return tuple(name for name in BATCH_AXES if name in mesh.axis_names)


def batch_devices(mesh: Mesh) -> int:
  """How many parts a batch's rows are split into: data x fsdp."""
  return math.prod(size(mesh, name) for name in batch_axes(mesh))


def describe(mesh: Mesh) -> str:
  """'data=4 fsdp=2 sequence=1' (the mesh's axes and sizes)."""
  return ' '.join(f'{name}={size(mesh, name)}' for name in mesh.axis_names)


def check_batch(mesh: Mesh, batch_size: int, field: str = 'batch_size') -> None:
  """ValueError unless `config.dataset.<field>` splits evenly over data x fsdp."""
  n = batch_devices(mesh)
  if batch_size % n:
    parts = ' x '.join(f'{name} {size(mesh, name)}' for name in batch_axes(mesh))
    raise ValueError(
      f'config.dataset.{field}={batch_size} must be divisible by the number of '
      f'devices its rows are split over, {n} ({parts}: config.train.mesh); '
      f'valid: multiples of {n}'
    )


def check_length(mesh: Mesh, length: int, what: str) -> None:
  """ValueError unless a sequence of `length` tokens splits evenly over 'sequence'."""
  n = size(mesh, SEQUENCE_AXIS)
  if n > 1 and length % n:
    raise ValueError(
      f"sequence length {length} ({what}) is not divisible by "
      f"config.train.mesh['sequence']={n}; valid: lengths that are "
      f'multiples of {n}, or a sequence size dividing {length}'
    )


# ----------------------------------------------------------------------------
# Parameters and optimiser state: the FSDP rule.
# ----------------------------------------------------------------------------


def fsdp_axis(shape: Sequence[int], fsdp: int, min_size: int = FSDP_MIN_SIZE) -> Optional[int]:
  """The axis of a leaf of `shape` that FSDP splits over `fsdp` devices: its largest axis
  that `fsdp` divides (the first of equals), or None (replicated) when fsdp is 1, the leaf
  has fewer than `min_size` elements or no axis is divisible."""
  if fsdp <= 1 or math.prod(shape) < min_size:
    return None
  candidates = [(n, -i) for i, n in enumerate(shape) if n % fsdp == 0]
  return -max(candidates)[1] if candidates else None


def leaf_spec(mesh: Mesh, shape: Sequence[int], min_size: int = FSDP_MIN_SIZE) -> P:
  """The PartitionSpec of a parameter or optimiser-state leaf of `shape`."""
  axis = fsdp_axis(shape, size(mesh, 'fsdp'), min_size)
  if axis is None:
    return P()
  return P(*(['fsdp' if i == axis else None for i in range(len(shape))]))


def state_shardings(mesh: Mesh, tree, min_size: int = FSDP_MIN_SIZE):
  """The NamedShardings of a tree of parameters or optimiser state (arrays or
  ShapeDtypeStructs, any structure): `leaf_spec` of each leaf."""
  return jax.tree.map(lambda x: NamedSharding(mesh, leaf_spec(mesh, np.shape(x), min_size)), tree)


def with_shardings(shapes, mesh: Mesh, min_size: int = FSDP_MIN_SIZE):
  """ShapeDtypeStructs of `shapes` (e.g. `jax.eval_shape`'s) carrying `state_shardings`."""
  return jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(
      s.shape, s.dtype, sharding=NamedSharding(mesh, leaf_spec(mesh, s.shape, min_size))
    ),
    shapes,
  )


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


# ----------------------------------------------------------------------------
# Batches.
# ----------------------------------------------------------------------------


def _is_tokens(path, x) -> bool:
  """The batch's token array: 'inputs' of integers `[b, n]` (`[b, 2, n]` for pairs)."""
  key = path[-1] if path else None
  name = getattr(key, 'key', getattr(key, 'name', None))
  return (
    name == 'inputs'
    and np.ndim(x) >= 2
    and np.issubdtype(np.dtype(getattr(x, 'dtype', np.float32)), np.integer)
  )


def batch_spec(mesh: Mesh, path, x) -> P:
  """Rows over data x fsdp; the token axis (the last of 'inputs' `[b, ..., n]`) over
  'sequence' when the mesh splits the sequence."""
  rows = batch_axes(mesh)
  n = size(mesh, SEQUENCE_AXIS)
  if n > 1 and _is_tokens(path, x) and np.shape(x)[-1] % n == 0:
    return P(rows, *([None] * (np.ndim(x) - 2)), SEQUENCE_AXIS)
  return P(rows)


def batch_shardings(mesh: Mesh, batch):
  """The NamedShardings of a batch (a dict of `[b, ...]` arrays or ShapeDtypeStructs)."""
  return jax.tree_util.tree_map_with_path(
    lambda path, x: NamedSharding(mesh, batch_spec(mesh, path, x)), batch
  )


@functools.lru_cache(maxsize=None)
def data_processes(mesh: Mesh) -> Tuple[int, int]:
  """(index, count): which of `count` distinct slices of each global batch this process
  feeds. Processes whose devices hold the same rows (the sequence split across them,
  say) read the same examples; one process: (0, 1).

  ValueError when the processes' rows overlap without being equal (a device arrangement
  the data pipeline cannot feed).
  """
  if jax.process_count() == 1:
    return 0, 1
  rows = batch_devices(mesh)
  sharding = NamedSharding(mesh, P(batch_axes(mesh)))
  held: Dict[int, set] = {}
  for device, index in sharding.devices_indices_map((rows,)).items():
    held.setdefault(device.process_index, set()).update(range(rows)[index[0]])
  groups = sorted({tuple(sorted(r)) for r in held.values()})
  flat = [row for group in groups for row in group]
  if len(flat) != len(set(flat)) or len({len(g) for g in groups}) != 1:
    raise ValueError(
      f'the mesh ({describe(mesh)}) gives processes overlapping parts of the '
      f'batch; valid: meshes whose data x fsdp blocks are whole to a process '
      f'or shared by processes alike'
    )
  return groups.index(tuple(sorted(held[jax.process_index()]))), len(groups)


def gathered(tree):
  """`tree` on the host (numpy): `jax.device_get`, gathering arrays that span processes
  (a collective where any does: every process must call it)."""

  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))

  return jax.tree.map(get, tree)

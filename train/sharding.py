"""Multi-host setup and host data feeding onto a `jax.sharding.Mesh`.

The mesh itself, its axes ('data', 'fsdp', 'sequence') and the shardings of
batches, parameters and optimiser state are `train/mesh.py`'s; `create_mesh`
here is the plain 1-D 'data' mesh (replicated parameters) that loading a run for
analysis uses. A process feeds only its own slice of the global batch (its rows,
in process order; processes that hold the same rows, the sequence split across
them, feed the same ones) and `jax.make_array_from_process_local_data`
assembles the global array, so the jit-compiled step is the same program on 1 or
1000 devices.
"""

import collections
import os
import sys
import threading
from typing import Iterator, Optional

from absl import logging
import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from train import mesh as mesh_lib

DATA_AXIS = 'data'
# Environment variables that mean "this process is one of several" (JAX's own
# cluster detection then fills in the coordinator, count and id).
_CLUSTER_ENV = (
  'JAX_COORDINATOR_ADDRESS',
  'SLURM_NTASKS',
  'OMPI_COMM_WORLD_SIZE',
  'MEGASCALE_COORDINATOR_ADDRESS',
  'TPU_WORKER_HOSTNAMES',
)


def _multi_process_env() -> bool:
  for name in _CLUSTER_ENV:
    value = os.environ.get(name, '')
    if name == 'TPU_WORKER_HOSTNAMES':
      if len(value.split(',')) > 1:
        return True
    elif name in ('SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE'):
      if value.isdigit() and int(value) > 1:
        return True
    elif value:
      return True
  return False


def check_distributed_flags(coordinator_address: str, num_processes: int, process_id: int) -> None:
  """One-line ValueErrors for multi-host settings that cannot work."""
  if num_processes < 0:
    raise ValueError(
      f'--num_processes={num_processes} is not valid; it must be >= 1 (or 0: from the environment)'
    )
  if process_id < -1 or (num_processes > 0 and process_id >= num_processes):
    valid = f'0..{num_processes - 1}' if num_processes > 0 else '>= 0'
    raise ValueError(
      f'--process_id={process_id} is not valid for --num_processes={num_processes}; valid: {valid}'
    )
  if (num_processes > 1 or process_id >= 0) and not coordinator_address:
    raise ValueError(
      f'--num_processes={num_processes} --process_id={process_id} need '
      f'--coordinator_address=host:port (process 0\'s address)'
    )
  if coordinator_address and num_processes > 1 and process_id < 0:
    raise ValueError(
      f'--coordinator_address={coordinator_address} with --num_processes='
      f'{num_processes} needs --process_id (0..{num_processes - 1})'
    )


def initialize_distributed(
  coordinator_address: str = '',
  num_processes: int = 0,
  process_id: int = -1,
  mode: str = 'auto',
  timeout_s: int = 300,
) -> bool:
  """Calls `jax.distributed.initialize` when this is a multi-process run.

  Args:
    coordinator_address, num_processes, process_id: explicit settings (flags);
      with a coordinator address they are passed as given. Unset, they are read
      from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID (the
      last two are this project's names: JAX itself reads only the first).
    mode: 'auto' (initialize with the explicit settings, or with no arguments
      when the environment describes a cluster: a TPU pod slice, SLURM, Open
      MPI, JAX_COORDINATOR_ADDRESS), 'on' (always, no-argument form unless
      settings are given) or 'off'.
    timeout_s: how long to wait for every process to connect before failing.
  Returns:
    whether jax.distributed was initialised.
  """
  if mode not in ('auto', 'on', 'off'):
    raise ValueError(f"distributed mode {mode!r} is not valid; valid choices: auto, on, off")
  if mode == 'off':
    return False
  env = os.environ
  coordinator_address = coordinator_address or env.get('JAX_COORDINATOR_ADDRESS', '')
  num_processes = num_processes if num_processes > 0 else int(env.get('JAX_NUM_PROCESSES', 0))
  process_id = process_id if process_id >= 0 else int(env.get('JAX_PROCESS_ID', -1))
  check_distributed_flags(coordinator_address, num_processes, process_id)
  if coordinator_address:
    logging.info(
      'jax.distributed: process %s of %s connecting to %s (waiting up to %d s for every process)',
      process_id,
      num_processes,
      coordinator_address,
      timeout_s,
    )
    message = (
      f'process {process_id} of {num_processes} could not join '
      f'{coordinator_address} within {timeout_s} s (is every process started, '
      f'with the same --coordinator_address and --num_processes?)'
    )
    # JAX aborts the process when peers are missing; say why first, and exit cleanly.
    watchdog = threading.Timer(
      timeout_s, lambda: (sys.stderr.write(f'Error: {message}\n'), sys.stderr.flush(), os._exit(1))
    )
    watchdog.daemon = True
    watchdog.start()
    try:
      jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes if num_processes > 0 else None,
        process_id=process_id if process_id >= 0 else None,
        initialization_timeout=timeout_s + 60,
      )
    except Exception as e:  # pylint: disable=broad-except  (XLA runtime errors)
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise ConnectionError(f'{message}: {first}') from None
    finally:
      watchdog.cancel()
  elif mode == 'on' or _multi_process_env():
    jax.distributed.initialize(initialization_timeout=timeout_s)
  else:
    return False
  logging.info(
    'jax.distributed: process %d of %d, %d local / %d global devices',
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
  return True


def create_mesh(devices=None) -> Mesh:
  """A 1-D data-parallel mesh over `devices` (default: all devices of all hosts)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def check_batch_size(global_batch: int, mesh: Mesh, field: str = 'batch_size') -> None:
  if global_batch % mesh.size:
    raise ValueError(
      f'config.dataset.{field}={global_batch} must be divisible by the '
      f'number of devices ({mesh.size})'
    )


def to_global(local_batch, mesh: Mesh):
  """This process's rows (numpy dict) -> global arrays, rows over the mesh's data x fsdp
  and tokens over 'sequence' (`mesh_lib.batch_shardings`)."""
  _, parts = mesh_lib.data_processes(mesh)  # distinct slices of the batch over processes
  local_batch = jax.tree.map(np.asarray, local_batch)
  return jax.tree.map(
    lambda s, x: jax.make_array_from_process_local_data(s, x, (x.shape[0] * parts,) + x.shape[1:]),
    mesh_lib.batch_shardings(mesh, local_batch),
    local_batch,
  )


def prefetch(local_batches: Iterator, mesh: Mesh, size: int = 2) -> Iterator:
  """Transfers the next `size` batches to the devices while the current one runs."""
  queue = collections.deque()
  for batch in local_batches:
    queue.append(to_global(batch, mesh))
    if len(queue) > size:
      yield queue.popleft()
  while queue:
    yield queue.popleft()


def any_process(flag: bool) -> bool:
  """True on every process if `flag` is True on any (a collective: all must call)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  return bool(np.any(multihost_utils.process_allgather(np.asarray([flag]))))


def is_writer(process_index: Optional[int] = None) -> bool:
  """Only process 0 writes logs, summaries, metrics.jsonl and results."""
  return (jax.process_index() if process_index is None else process_index) == 0

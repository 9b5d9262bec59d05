"""What the numbers were measured on: peak memory of the process and the device, the
memory available, the CPU and device, in one line for a report's header."""

import datetime
import os
import platform
import resource
from typing import Any, Dict, Mapping, Optional

import jax


def peak_rss_bytes() -> int:
  """Peak resident set size of this process so far (Linux reports KiB)."""
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def device_peak_bytes() -> Optional[int]:
  """Peak bytes in use on the default device (GPU/TPU), None where not reported (CPU)."""
  stats = jax.devices()[0].memory_stats() if hasattr(jax.devices()[0], 'memory_stats') else None
  if not stats:
    return None
  return stats.get('peak_bytes_in_use')


def total_memory_bytes() -> Optional[int]:
  """Memory available to the computation: the device's limit, or the host's RAM on CPU."""
  dev = jax.devices()[0]
  if dev.platform != 'cpu':
    stats = dev.memory_stats() or {}
    if stats.get('bytes_limit'):
      return int(stats['bytes_limit'])
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemTotal:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def cpu_model() -> str:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def device_info() -> Dict[str, Any]:
  """What the numbers were measured on, and when."""
  dev = jax.devices()[0]
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return dict(
    date=datetime.datetime.now().astimezone().isoformat(timespec='seconds'),
    platform=dev.platform,
    device_kind=dev.device_kind,
    device_count=jax.device_count(),
    cpu_model=cpu_model(),
    cpu_count=cpus,
    memory_total_bytes=total_memory_bytes(),
    jax_version=jax.__version__,
    python_version=platform.python_version(),
    hostname=platform.node(),
  )


def describe_device(info: Mapping[str, Any]) -> str:
  """One line: 'cpu (AMD EPYC, 2 CPUs, 23.4 GiB RAM), jax 0.10.2, 2025-01-01T12:00:00+00:00'."""
  mem = info.get('memory_total_bytes')
  mem = f', {mem / 2**30:.1f} GiB RAM' if mem and info['platform'] == 'cpu' else ''
  kind = info['device_kind'] if info['platform'] != 'cpu' else info['cpu_model']
  return (
    f"{info['platform']} ({kind}, {info['cpu_count']} CPUs{mem}), "
    f"jax {info['jax_version']}, {info['date']}"
  )

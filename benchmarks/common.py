"""Shared benchmark pieces: building attention from a name, timing, memory, device facts.

An attention *target* is a name: 'exact' (`jax.nn.dot_product_attention`), a
registered mechanism ('linear', 'nystrom', ...; core attention on q, k, v
`[batch, length, heads, head_dim]`), or 'mechanism/projection' (a whole
`efficient_attn.MultiHeadAttention` layer on x `[batch, length, heads * head_dim]`).
"""

import contextlib
import dataclasses
import datetime
import math
import os
import platform
import resource
import statistics
import sys
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

import efficient_attn as ea

EXACT = 'exact'


# ----------------------------------------------------------------------------
# Command lines.
# ----------------------------------------------------------------------------


def parse_flags(
  define_flags: Callable[[Any], None],
  argv: Optional[Sequence[str]] = None,
  doc: str = '',
  *,
  positional: str = '',
):
  """absl flags of one tool, parsed from `argv` into their own FlagValues.

  `argv` holds the arguments without the program name (default sys.argv[1:]).
  Each tool defines its flags in `define_flags(flag_values)`, so several tools
  (and the tests) can parse their own command lines in one process. `--help`
  prints the tool's docstring and flags; a bad flag exits with a one-line
  'Error: ...'. JAX's missing-TPU notice is dropped (`train.api.quiet_logs`, as in
  main.py). Returns the FlagValues; non-flag arguments are an error unless
  `positional` names them (e.g. 'workdirs'): then at least one is required and
  the result is `(flag_values, [arguments])`.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top

  fv = flags.FlagValues()
  define_flags(fv)
  argv = list(sys.argv[1:] if argv is None else argv)
  if '--help' in argv or '-h' in argv:
    usage = f'\n\narguments: {positional} (one or more)' if positional else ''
    emit(doc.strip() + usage + '\n\nflags:\n' + fv.get_help())  # e.g. `--help | head`
    sys.exit(0)
  try:
    rest = fv(['tool'] + argv)[1:]
  except flags.Error as e:
    sys.exit(f'Error: {e}')
  from train import api  # pylint: disable=g-import-not-at-top

  api.quiet_logs(verbosity_given=True)  # no missing-TPU notice, as main.py
  if not positional:
    if rest:
      sys.exit(f'Error: unexpected arguments {rest}')
    return fv
  if not rest:
    sys.exit(f'Error: missing argument: {positional} (one or more)')
  return fv, rest


def emit(text: str, stream=None) -> None:
  """Prints `text` to `stream` (stdout) and flushes it. A reader that stops early (`| head`)
  is not an error: the rest is dropped, and the exit makes no BrokenPipeError traceback."""
  stream = stream or sys.stdout
  try:
    print(text, file=stream, flush=True)
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # for the exit's own flush


def define_output_flags(fv, *, out: str, name: str, quiet: bool = True) -> None:
  """The flags every tool that writes a table shares: --out (folder), --name (file name
  stem of the .json / .md / .png it writes) and, with `quiet`, --quiet (no progress
  lines or printed table)."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_string('out', out, 'output folder', flag_values=fv)
  flags.DEFINE_string('name', name, 'file name stem of the outputs', flag_values=fv)
  if quiet:
    flags.DEFINE_bool('quiet', False, 'no progress lines or printed table', flag_values=fv)


@contextlib.contextmanager
def flag_errors():
  """Around a tool's reading of its flag values, before anything is written: a ValueError
  (an unknown mechanism, a list item that is not a number) or FileNotFoundError (a missing
  workdir) exits with its first line, 'Error: ...'."""
  try:
    yield
  except (ValueError, FileNotFoundError) as e:
    lines = str(e).strip().splitlines()
    raise SystemExit(f'Error: {lines[0] if lines else type(e).__name__}') from None


def check_choices(flag: str, given: Sequence[str], valid: Sequence[str]) -> None:
  """ValueError '--<flag>: unknown [...]; valid: a, b' when `given` holds a value outside
  `valid` (for `flag_errors`)."""
  bad = sorted(set(given) - set(valid))
  if bad:
    raise ValueError(f'--{flag}: unknown {bad}; valid: {", ".join(valid)}')


# ----------------------------------------------------------------------------
# Building a benchmark from a name.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class Bench:
  """A function, its variables and inputs: `fn(variables, *inputs) -> array`.

  `variables` is a Flax variables dict (possibly empty); its 'params' are
  differentiated in the forward+backward pass together with all inputs.
  """

  label: str
  fn: Callable[..., Any]
  variables: Any
  inputs: Tuple[Any, ...]
  options: Dict[str, Any]

  def forward(self):
    """(function, args) for the forward pass."""
    return self.fn, (self.variables,) + self.inputs

  def forward_backward(self):
    """(function, args): gradient of sum(outputs) w.r.t. params and all inputs."""
    rest = {c: v for c, v in self.variables.items() if c != 'params'}
    params = self.variables.get('params', {})

    def loss(p, *inputs):
      out = self.fn(dict(rest, params=p) if p else rest, *inputs)
      return jnp.sum(out.astype(jnp.float32))

    grad = jax.grad(loss, argnums=tuple(range(1 + len(self.inputs))))
    return grad, (params,) + self.inputs


def random_qkv(seed: int, batch: int, length: int, heads: int, head_dim: int, dtype=jnp.float32):
  """q, k, v `[batch, length, heads, head_dim]`, standard normal."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return tuple(jax.random.normal(k, (batch, length, heads, head_dim), dtype) for k in keys)


def exact_attention(q, k, v, causal: bool = False, implementation: Optional[str] = None):
  """`jax.nn.dot_product_attention` (XLA on CPU unless `implementation` says otherwise)."""
  return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=implementation)


def mechanism_bench(
  name: str,
  q,
  k,
  v,
  *,
  options: Optional[Mapping[str, Any]] = None,
  causal: bool = False,
  seed: int = 0,
  exact_implementation: Optional[str] = None,
) -> Bench:
  """Core attention of mechanism `name` (or 'exact') on q, k, v.

  Fixed-length mechanisms (Linformer) are built with max_length = kv length, and
  causal-only ones (the gated recurrences) causal. Parameters are initialised from
  `seed`. A mechanism whose gates read the layer input (`reads_input`) reads q
  `[batch, length, heads * head_dim]` as that input.
  """
  options = dict(options or {})
  if name == EXACT:
    fn = lambda variables, q, k, v: exact_attention(q, k, v, causal, exact_implementation)
    return Bench(name, fn, {}, (q, k, v), options)
  module = build_mechanism(name, k.shape[1], options, causal)
  inputs = lambda q: (
    {'inputs': q.reshape(q.shape[:2] + (-1,))} if ea.get_mechanism(name).reads_input else {}
  )
  variables = jax.jit(lambda key, q, k, v: module.init(key, q, k, v, **inputs(q)))(
    jax.random.PRNGKey(seed), q, k, v
  )
  fn = lambda variables, q, k, v: module.apply(variables, q, k, v, **inputs(q))
  return Bench(name, fn, dict(variables), (q, k, v), options)


def build_mechanism(
  name: str, length: int, options: Optional[Mapping[str, Any]] = None, causal: bool = False
):
  """The mechanism's Linen module; fixed-length ones are built for `length` tokens, and a
  causal-only one is causal."""
  causal = causal or ea.get_mechanism(name).causal_only
  return ea.mechanism_module(name, causal=causal, max_length=length, options=dict(options or {}))


def layer_bench(
  mechanism: str,
  projection: str,
  x,
  *,
  num_heads: int,
  options: Optional[Mapping[str, Any]] = None,
  causal: bool = False,
  seed: int = 0,
) -> Bench:
  """A whole `MultiHeadAttention(mechanism, projection)` layer on x `[batch, length, d_model]`.

  x may be a `jax.ShapeDtypeStruct`: the variables are then shapes only
  (`jax.eval_shape`), enough to lower, compile and count, without allocating.
  """
  layer = attention_layer(
    mechanism, projection, num_heads=num_heads, length=x.shape[1], options=options, causal=causal
  )
  key = jax.random.PRNGKey(seed)
  if isinstance(x, jax.ShapeDtypeStruct):
    variables = jax.eval_shape(layer.init, key, x)
  else:
    variables = jax.jit(layer.init)(key, x)
  fn = lambda variables, x: layer.apply(variables, x)
  return Bench(f'{mechanism}/{projection}', fn, dict(variables), (x,), dict(options or {}))


def attention_layer(
  mechanism: str,
  projection: str,
  *,
  num_heads: int,
  length: int,
  options: Optional[Mapping[str, Any]] = None,
  causal: bool = False,
):
  """`ea.MultiHeadAttention` with max_length = length (for 'super' and Linformer); a
  causal-only mechanism is causal."""
  causal = causal or ea.get_mechanism(mechanism).causal_only
  return ea.MultiHeadAttention(
    num_heads=num_heads,
    mechanism=mechanism,
    projection=projection,
    options=dict(options or {}) or None,
    causal=causal,
    max_length=length,
  )


def parse_target(target: str) -> Tuple[str, Optional[str]]:
  """'linear/efficient' -> ('linear', 'efficient'); 'linear' -> ('linear', None).

  Raises ValueError listing the valid names for an unknown mechanism or projection.
  """
  mechanism, _, projection = target.partition('/')
  if mechanism != EXACT:
    ea.get_mechanism(mechanism)
  elif projection:
    raise ValueError(f"'{EXACT}' is core attention only, not a layer: {target!r}")
  if projection:
    ea.registry.check_projection(projection)
  return mechanism, projection or None


def parse_options(items: Sequence[str]) -> Dict[str, Dict[str, Any]]:
  """['nystrom.num_landmarks=32', 'linear.feature_map=relu'] -> {'nystrom': {...}, ...}.

  Values are parsed as int, float, bool or None when they look like one. Raises
  ValueError for an unknown mechanism or option, or a value the option refuses.
  """
  out: Dict[str, Dict[str, Any]] = {}
  for item in items:
    key, sep, value = item.partition('=')
    mechanism, dot, option = key.partition('.')
    if not sep or not dot:
      raise ValueError(f'option {item!r} must look like mechanism.option=value')
    out.setdefault(mechanism, {})[option] = parse_value(value)
  for mechanism, options in out.items():
    try:
      effective_options(mechanism, options)
    except ValueError as e:
      raise ValueError(f'--option: {e}') from None
  return out


def parse_value(text: str) -> Any:
  lowered = text.lower()
  if lowered in ('true', 'false'):
    return lowered == 'true'
  if lowered == 'none':
    return None
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return text


CASTS = {int: ('an integer', 'integers'), float: ('a number', 'numbers')}


def csv_list(text: str, cast: Callable[[str], Any] = str, flag: str = '') -> list:
  """'a,b,,c' -> [cast(a), cast(b), cast(c)].

  Raises ValueError naming `flag` (e.g. '--lengths'), the text and the bad item.
  """
  out = []
  for item in (t.strip() for t in text.split(',')):
    try:
      out += [cast(item)] if item else []
    except ValueError:
      name = getattr(cast, '__name__', 'value')
      one, many = CASTS.get(cast, (f'a valid {name}', f'{name} values'))
      raise ValueError(
        f'{flag or "list"}={text!r} is not valid: {item!r} is not {one}; '
        f'valid: a comma list of {many}'
      ) from None
  return out


def available_mechanisms() -> Tuple[str, ...]:
  """Every registered mechanism."""
  return ea.list_mechanisms()


def count_params(tree) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(tree)))


# ----------------------------------------------------------------------------
# Timing.
# ----------------------------------------------------------------------------


def block(x):
  return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, 'block_until_ready') else a, x)


def time_compiled(
  compiled: Callable[..., Any], args: Sequence[Any], *, repeats: int, budget_s: float
) -> Dict[str, Any]:
  """Median (and minimum) wall time of `compiled(*args)` after one warm-up call.

  Runs the warm-up, then up to `repeats` timed calls, stopping early once the
  timed calls have used half of `budget_s` (at least one timed call). If the
  warm-up alone exceeds the budget, it is reported as the single measurement
  (`from_warmup=True`): for calls that long, first-call overhead is negligible.
  Every call is followed by `block_until_ready`.
  """
  start = time.perf_counter()
  block(compiled(*args))
  warmup = time.perf_counter() - start
  times = []
  if warmup > budget_s:
    times, from_warmup = [warmup], True
  else:
    from_warmup = False
    while len(times) < max(1, repeats):
      start = time.perf_counter()
      block(compiled(*args))
      times.append(time.perf_counter() - start)
      if sum(times) > budget_s / 2:
        break
  return dict(
    time_s=statistics.median(times),
    min_s=min(times),
    times_s=times,
    warmup_s=warmup,
    runs=len(times),
    from_warmup=from_warmup,
  )


def predict_time(
  lengths: Sequence[int], times: Sequence[float], length: int, default_exponent: float = 2.0
) -> Optional[float]:
  """Extrapolates time to `length` from earlier (length, time) points.

  Uses the log-log slope of the last two points (clipped to [1, 2.5]), or
  `default_exponent` with one point; None with none.
  """
  if not lengths:
    return None
  exponent = default_exponent
  if len(lengths) >= 2 and lengths[-1] != lengths[-2] and times[-2] > 0:
    exponent = math.log(times[-1] / times[-2]) / math.log(lengths[-1] / lengths[-2])
    exponent = min(max(exponent, 1.0), 2.5)
  return times[-1] * (length / lengths[-1]) ** exponent


def fit_exponent(
  xs: Sequence[float], ys: Sequence[float], lo: Optional[float] = None, hi: Optional[float] = None
) -> Optional[float]:
  """Least-squares slope of log(y) against log(x) over points with lo <= x <= hi.

  None if fewer than two usable points (missing or non-positive values are dropped).
  """
  pts = [
    (x, y)
    for x, y in zip(xs, ys)
    if y is not None and y > 0 and (lo is None or x >= lo) and (hi is None or x <= hi)
  ]
  if len({x for x, _ in pts}) < 2:
    return None
  lx = np.log([x for x, _ in pts])
  ly = np.log([y for _, y in pts])
  return float(np.polyfit(lx, ly, 1)[0])


# ----------------------------------------------------------------------------
# Memory and the machine.
# ----------------------------------------------------------------------------


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


def effective_options(
  mechanism: str, overrides: Optional[Mapping[str, Any]] = None
) -> Dict[str, Any]:
  """The mechanism's options with their values (declared defaults + overrides)."""
  if mechanism == EXACT:
    return dict(overrides or {})
  return dict(
    ea.get_mechanism(mechanism).resolve(
      {k: v for k, v in (overrides or {}).items() if not k.startswith('_')}
    )
  )

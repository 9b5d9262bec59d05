"""The benchmarks' command lines: each tool's flags parsed into their own FlagValues, the
output flags they share, one-line errors for bad values, and the parsers of lists and
options.

The other shared pieces: `attention_bench` (an attention benchmark built from a name),
`timing` (timed calls, log-log fits), `machine` (memory and device facts), `xla_stats`,
`output` and `runs`.
"""

import contextlib
import os
import sys
from typing import Any, Callable, Dict, Optional, Sequence

from benchmarks import attention_bench


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
      attention_bench.effective_options(mechanism, options)
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

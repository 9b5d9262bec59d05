"""A config is resolved once: its walk through the code makes few return visits.

The walk of `config` is measured with `sys.setprofile` over one tiny run of
`trainer.train_and_evaluate` (the default config with a smaller ViT, two steps,
one evaluation; the walk does not depend on the sizes):

  * a *config call* is a call of a function defined in one of the project's
    packages (efficient_attn/, train/, data/, configs/) that receives a
    `ConfigDict` (the config, a copy of it, or a group of it such as
    `config.dataset`) as an argument, directly or in *args/**kwargs;
  * the call *enters* its file when the nearest config call still running
    (the one that handed it the config) is in another file, or when there is none;
  * a file's *visits* are its entries; its *return visits* are those after the first.

So `checks.check(config)` calling `specs.source(config)`, then, back in
checks.py, `specs.in_memory(config)` enters specs.py twice (one return visit), while
`specs.in_memory` calling `specs.source` inside specs.py enters nothing. A generator
resumed is not a new call. Issue 32 counted 39 return visits through 16 files; a
config resolved once and handed down as its resolved pieces needs at most half. (By
this definition the code of e0deae2, before `validate.resolve`, made 58 return visits
through 13 files and looked the mechanism up 5 times; 22414ad, 14 through 10, and once;
the code issue 66 read, dda7d4d, 14 through 11.) Issue 66 counted 27 by another
count (this walk gives 28 when it also follows the model's `TransformerConfig`) and
asked for at most 15: with what the model reads resolved by `modeling.check` and the
attention resolved once (`train/attention.py`), both handed down, 12 through 14.

    python tests/train/test_config_walk.py   # prints the walk: every entry, and the visits per file
"""

import collections
import contextlib
import io
import os
import sys

import ml_collections
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = tuple(
  os.path.join(ROOT, p) + os.sep for p in ('efficient_attn', 'train', 'data', 'configs')
)
REGISTRY = os.path.join('efficient_attn', 'registry.py')
MOST_RETURN_VISITS = 12  # issue 66 asked for at most 15; 12 since the attention's resolution
CONFIGS = (ml_collections.ConfigDict, ml_collections.FrozenConfigDict)


def _carries_config(frame) -> bool:
  code = frame.f_code
  n = code.co_argcount + code.co_kwonlyargcount
  names = list(code.co_varnames[:n])
  flags = code.co_flags
  if flags & 0x04:  # *args
    names.append(code.co_varnames[n])
    n += 1
  if flags & 0x08:  # **kwargs
    names.append(code.co_varnames[n])
  for name in names:
    value = frame.f_locals.get(name)
    if isinstance(value, CONFIGS):
      return True
    if isinstance(value, tuple) and any(isinstance(v, CONFIGS) for v in value):
      return True
    if (
      isinstance(value, dict)
      and not isinstance(value, CONFIGS)
      and any(isinstance(v, CONFIGS) for v in value.values())
    ):
      return True
  return False


class Walk:
  """The config calls of a run, recorded by `sys.setprofile` (see the module docstring)."""

  def __init__(self):
    self.entries = []  # [(file, function)]: each entry into a file, in order
    self.lookups = 0  # calls of registry.get_mechanism (a mechanism looked up by name)
    self._frames = {}  # id -> frame of each config call seen (kept alive: ids stay unique)
    self._ours = {}  # code -> its project file, or None

  def _file(self, code):
    if code not in self._ours:
      path = code.co_filename
      ours = path.startswith(PACKAGES)
      self._ours[code] = os.path.relpath(path, ROOT) if ours else None
    return self._ours[code]

  def _profile(self, frame, event, arg):
    del arg
    if event != 'call':
      return
    path = self._file(frame.f_code)
    if path == REGISTRY and frame.f_code.co_name == 'get_mechanism':
      self.lookups += 1
    if path is None or self._frames.get(id(frame)) is frame or not _carries_config(frame):
      return
    self._frames[id(frame)] = frame
    caller = frame.f_back
    while caller is not None and self._frames.get(id(caller)) is not caller:
      caller = caller.f_back
    if caller is None or self._file(caller.f_code) != path:
      self.entries.append((path, frame.f_code.co_name))

  @contextlib.contextmanager
  def recording(self):
    sys.setprofile(self._profile)
    try:
      yield self
    finally:
      sys.setprofile(None)
      self._frames.clear()

  def visits(self):
    return collections.Counter(path for path, _ in self.entries)

  def return_visits(self) -> int:
    return len(self.entries) - len(self.visits())

  def report(self) -> str:
    lines = [f'{path}:{name}' for path, name in self.entries]
    lines += [f'{n:3d} {path}' for path, n in self.visits().most_common()]
    lines.append(
      f'{self.return_visits()} return visits through {len(self.visits())} files; '
      f'the mechanism looked up {self.lookups} times'
    )
    return '\n'.join(lines)


def walk_of_a_tiny_run(workdir: str) -> Walk:
  """The walk of `train_and_evaluate` on the default config (a smaller ViT), two steps."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from train import trainer  # pylint: disable=g-import-not-at-top

  config = default.get_config()
  config.model.update(dict(d_model=16, depth=1, num_heads=2, mlp_dim=16))
  config.train.num_steps = 2
  with contextlib.redirect_stdout(io.StringIO()), Walk().recording() as walk:
    trainer.train_and_evaluate(config, workdir)
  return walk


@pytest.mark.slow  # a training run (about 7 s of CPU)
def test_the_config_walk_makes_at_most_half_the_return_visits_of_issue_32(tmp_path):
  walk = walk_of_a_tiny_run(str(tmp_path))
  assert walk.entries[0] == ('train/trainer.py', 'train_and_evaluate'), walk.report()
  assert walk.return_visits() <= MOST_RETURN_VISITS, walk.report()
  # The mechanism is looked up by name once, when the config is checked; the model is
  # handed the declaration (each layer configures it once, test_resolve_once).
  assert walk.lookups == 1


def test_the_walk_counts_each_entry_into_another_file():
  """The definition, on the data package: checks.py enters specs.py once per call from it."""
  from data import specs  # pylint: disable=g-import-not-at-top

  config = ml_collections.ConfigDict({'dataset': {'name': 'digits', 'source': ''}})
  with Walk().recording() as walk:
    specs.in_memory(config)  # -> specs.source, same file: one entry
    specs.input_kind(config)  # another entry into specs.py
  assert walk.entries == [('data/specs.py', 'in_memory'), ('data/specs.py', 'input_kind')]
  assert walk.return_visits() == 1


if __name__ == '__main__':
  import tempfile  # pylint: disable=g-import-not-at-top

  sys.path.insert(0, ROOT)
  with tempfile.TemporaryDirectory() as d:
    print(walk_of_a_tiny_run(d).report())

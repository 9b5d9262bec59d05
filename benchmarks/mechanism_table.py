r"""The mechanism table of the README, generated from the registry's declarations.

Every column but the measured ones comes from what each mechanism declares
(`efficient_attn.get_mechanism(name)`); the measured columns come from a
speed benchmark's JSON (default `docs/results/speed_mechanisms.json`, written
by `python -m benchmarks.speed --name=speed_mechanisms`), where present.

    python -m benchmarks.mechanism_table                  # print the table
    python -m benchmarks.mechanism_table --update=README.md  # rewrite it in place

The README holds the table between the markers `<!-- mechanisms:start -->` and
`<!-- mechanisms:end -->`; a test checks that it is current.
"""

import json
import os
from typing import Any, Dict, List, Optional, Sequence

from absl import flags

from benchmarks import common
from benchmarks import output
import efficient_attn as ea

START, END = '<!-- mechanisms:start -->', '<!-- mechanisms:end -->'
SPEED_JSON = (
  'docs/results/speed_mechanisms.json'  # python -m benchmarks.speed --name=speed_mechanisms
)


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string(
    'speed_json',
    SPEED_JSON,
    'speed benchmark results for the measured columns ("" for none)',
    flag_values=fv,
  )
  flags.DEFINE_integer(
    'length', 4096, 'the sequence length of the measured columns', flag_values=fv
  )
  flags.DEFINE_string(
    'update', '', 'a markdown file whose table to rewrite in place', flag_values=fv
  )


def _measured(path: str, length: int) -> Dict[str, Dict[str, Any]]:
  """{mechanism: {'fwd_bwd': point}} at `length` from a speed JSON, if it exists."""
  if not path or not os.path.exists(path):
    return {}
  with open(path) as f:
    data = json.load(f)
  out: Dict[str, Dict[str, Any]] = {}
  for point in data.get('points', []):
    if point.get('length') == length and point.get('status') == 'ok':
      out.setdefault(point['target'], {})[point['mode']] = point
  return out


def _options(decl) -> str:
  shown = [
    f'{option.name}={option.default}'
    for option in decl.options
    if option.configurable and option.name not in ('scale', 'seed', 'eps')
  ]
  return ', '.join(shown) or '-'


def table(speed_json: str = '', length: int = 4096) -> str:
  """The markdown table (and a note on the measured columns)."""
  measured = _measured(speed_json, length)
  header = [
    'mechanism',
    'paper',
    'time',
    'memory',
    'causal',
    'decode',
    'masks',
    'rotary',
    'sequence split',
    'packed rows',
    'fixed length',
    'options (defaults)',
  ]
  if measured:
    header += [f'fwd+bwd s at n={length}', f'memory at n={length}']
  rows: List[List[Any]] = []
  for decl in ea.registry.mechanisms():
    row = [
      f'`{decl.name}`',
      decl.citation,
      decl.complexity[0],
      decl.complexity[1],
      'only' if decl.causal_only else 'yes' if decl.causal else 'no',
      decl.decode or '-',
      'any' if decl.masks == 'any' else 'key padding',
      decl.rotary or '-',
      decl.sequence_parallel or '-',
      'yes' if decl.segments else '-',
      'yes' if decl.fixed_length else 'no',
      _options(decl),
    ]
    if measured:
      point = measured.get(decl.name, {}).get('fwd_bwd', {})
      row += [
        output.fmt_num(point.get('time_s'), 3) if point else 'n/a',
        output.fmt_bytes(point.get('memory_bytes')) if point else 'n/a',
      ]
    rows.append(row)
  text = output.table(header, rows, 'l' * len(header))
  text += (
    '\n\nCausal "only": defined along the sequence, with no bidirectional form (a '
    'recurrence; a forget gate summed along it: Forgetting Attention; past blocks ranked by '
    "each query's scores: MoBA, NSA) "
    '(built with causal=True; a model\'s encoder runs it left to right).'
  )
  text += (
    '\n\nSequence split: how the layer\'s `sequence_axis` splits one sequence over the '
    'devices of a mesh axis (context parallelism, `efficient_attn.layers.parallel`): ring '
    '(key/value blocks passed around, online softmax; causal in the zigzag layout), '
    'prefix_state (the kernel states '
    'of the other devices, summed), decayed_state (decayed states), transition (state '
    'transitions composed), halo (the neighbours\' window of tokens); "-": it needs '
    'the whole sequence on one device.'
  )
  if measured:
    text += (
      f'\n\nMeasured columns: forward + backward of the mechanism alone (batch 1, 8 heads, '
      f'head_dim 64, float32), from `{speed_json}`; "n/a": not measured at n={length} '
      f'(skipped by the benchmark\'s time or memory budget, or too new). The command '
      f'is in that file and in docs/benchmarks.md.'
    )
  return text


def update(path: str, text: str) -> bool:
  """Rewrites the table between the markers of `path`; returns whether it changed."""
  with open(path) as f:
    content = f.read()
  if START not in content or END not in content:
    raise ValueError(f'{path} has no {START} ... {END} markers')
  head, rest = content.split(START, 1)
  _, tail = rest.split(END, 1)
  new = f'{head}{START}\n{text}\n{END}{tail}'
  if new != content:
    with open(path, 'w') as f:
      f.write(new)
  return new != content


def main(argv: Optional[Sequence[str]] = None) -> str:
  fv = common.parse_flags(define_flags, argv, __doc__)
  text = table(fv.speed_json, fv.length)
  if fv.update:
    changed = update(fv.update, text)
    print(f'{fv.update}: {"updated" if changed else "already current"}')
  else:
    print(text)
  return text


if __name__ == '__main__':
  main()

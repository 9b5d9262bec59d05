r"""Where a recall run's gradient goes: gradient norms per parameter, at initialisation and
at the run's last checkpoint, on its first training batch.

    python -m studies.recall.gradients runs/recall/seed0/mamba2-d128-l128-kv8 \
        runs/recall/seed0/gated_deltanet-d128-l128-kv8 --out=studies/recall --name=gradients

A model that never leaves chance on MQAR may have a memory path (keys, queries, the decay)
that gets too little of the gradient to be learnt within the budget. The key projection's
gradient against the value projection's says how much: the value reaches the output by
other paths too (Mamba-2's D x skip), the key only through the state. The initial
parameters are the run's own (its config's seed), rebuilt without training.

Writes <out>/<name>.md (a row per run and moment, a column per parameter that --match
selects, and each layer's key / value ratio) and <out>/<name>.json (every parameter); the
command they record names a workdir outside the checkout relative to it
(`studies.hygiene.portable`).
"""

import json
import os
import re
from typing import Any, Dict, List, Sequence

from absl import app
from absl import flags
import jax
import numpy as np

from studies import hygiene
from train import api

FLAGS = flags.FLAGS
MATCH = r'block_0/attention/((key|query|value)/kernel|mechanism/(A_log|dt_bias))$'


def define_flags():
  """The command's flags, defined when it runs (studies.recall.report has its own --out)."""
  flags.DEFINE_string('out', 'studies/recall', 'Folder for the report files.')
  flags.DEFINE_string('name', 'gradients', 'Report file name (no extension).')
  flags.DEFINE_string(
    'match',
    MATCH,
    'Regular expression: report the parameters whose '
    "path ('block_0/attention/key/kernel') matches.",
  )


def gradient_norms(loss_fn, params) -> Dict[str, float]:
  """{parameter path: L2 norm of d loss_fn / d parameter} for every leaf of `params`."""
  grads = jax.device_get(jax.grad(loss_fn)(params))
  return {
    _name(path): float(np.linalg.norm(np.asarray(g, np.float64)))
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]
  }


def _name(path) -> str:
  """ "['decoder']['block_0']['attention']['key']['kernel']" -> 'block_0/attention/key/kernel'."""
  return '/'.join(
    k for k in re.findall(r"\['([^']*)'\]", jax.tree_util.keystr(path)) if k != 'decoder'
  )


def run_norms(workdir: str) -> Dict[str, Any]:
  """A run's gradient norms at its initial parameters and at its last checkpoint."""
  config = api.stored_config(workdir)
  if config is None:
    raise FileNotFoundError(f'{workdir} has no stored config: not a run directory')
  built = api.build(config)
  _, trained = built.restore_params(workdir)
  batch = next(iter(built.train_batches()))

  def loss(params):  # the trainer's loss, without dropout
    return built.task.loss_and_metrics(built.model, params, batch, train=False)[0]

  return dict(
    workdir=workdir,
    name=os.path.basename(os.path.normpath(workdir)),
    init=gradient_norms(loss, built.state.params),
    final=gradient_norms(loss, trained),
  )


def layers(names: Sequence[str]) -> List[str]:
  """The layers ('block_0', 'block_1', ...) that have an attention key kernel, in order."""
  found = {
    m.group(1): int(m.group(2))
    for n in names
    for m in [re.fullmatch(r'(block_(\d+))/attention/key/kernel', n)]
    if m
  }
  return sorted(found, key=found.get)


def markdown(runs: Sequence[Dict[str, Any]], match: str, command: str) -> str:
  """One row per run and moment (init, final), one column per matched parameter of any run
  ('-' where a run has none), and per layer the ratio of its key-kernel gradient to its
  value-kernel gradient."""
  names = list(dict.fromkeys(n for r in runs for n in r['init'] if re.search(match, n)))
  blocks = layers([n for r in runs for n in r['init']])
  head = ['run', 'moment'] + names + [f'{b} key / value' for b in blocks]
  lines = [f'command: `{command}`', '', '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in runs:
    for when in ('init', 'final'):
      norms = r[when]
      cells = [f'{norms[n]:.2e}' if n in norms else '-' for n in names]
      for b in blocks:
        key = norms.get(f'{b}/attention/key/kernel')
        value = norms.get(f'{b}/attention/value/kernel')
        cells.append(f'{key / value:.3f}' if key is not None and value else '-')
      lines.append(f'| {r["name"]} | {when} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def main(argv):
  if len(argv) < 2:
    raise app.UsageError('give one or more run workdirs')
  re.compile(FLAGS.match)  # a bad expression fails before any work
  runs = [run_norms(w) for w in argv[1:]]
  command = (
    'python -m studies.recall.gradients '
    + ' '.join(map(hygiene.portable, argv[1:]))
    + (f" --match='{FLAGS.match}'" if FLAGS.match != MATCH else '')
    + f' --out={FLAGS.out} --name={FLAGS.name}'
  )
  table = markdown(runs, FLAGS.match, command)
  os.makedirs(FLAGS.out, exist_ok=True)
  base = os.path.join(FLAGS.out, FLAGS.name)
  with open(base + '.json', 'w') as f:
    json.dump(dict(command=command, runs=runs), f, indent=1)
  with open(base + '.md', 'w') as f:
    f.write(table)
  print(table)


if __name__ == '__main__':
  define_flags()
  app.run(main)

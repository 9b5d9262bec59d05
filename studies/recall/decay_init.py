r"""The decay each head of a recall model starts with: Gated DeltaNet's and Mamba-2's.

Both decay the state by a_t = exp(-A dt_t) per head and token, with A and dt drawn at
initialisation (A uniform in [0, 16] for Gated DeltaNet, [1, 16] for Mamba-2; dt
log-uniform in [dt_min, dt_max], by default [0.001, 0.1]). Before training dt_t is close to
softplus(dt_bias), so a head keeps exp(-n A softplus(dt_bias)) of what it stored n tokens
ago. This tool initialises `configs/mqar.py`'s model exactly as the trainer does (its
`train.seed` as the key) and lists, per block and head, A, dt and what the head keeps over
the cell's sequence length. No training.

    python -m studies.recall.decay_init --out=studies/recall --name=decay_init
    python -m studies.recall.decay_init --mechanisms=gated_deltanet --widths=64 --seeds=0,1 \
        --options=dt_min=1e-4,dt_max=1e-3

Writes <out>/<name>.json (one row per mechanism, width, seed, block and head).
"""

import json
import os
from typing import Any, Dict, List, Sequence

from absl import app
from absl import flags
import jax
import numpy as np

from configs import mqar
from train import api

_OUT = flags.DEFINE_string('out', 'studies/recall', 'Output folder.')
_NAME = flags.DEFINE_string('name', 'decay_init', 'Output file name (no extension).')
_MECHANISMS = flags.DEFINE_list(
  'mechanisms',
  ['gated_deltanet', 'mamba2'],
  'Mechanisms with a Mamba-style decay (A_log, dt_bias).',
)
_WIDTHS = flags.DEFINE_list('widths', ['64', '128'], 'Model widths.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1'], 'train.seed values.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 128, "The cell's sequence length.")
_OPTIONS = flags.DEFINE_list('options', [], 'Attention options, key=value (e.g. dt_max=1e-3).')


def decays(
  mechanism: str, width: int, seed: int, seq_len: int, options: Dict[str, Any]
) -> List[Dict[str, Any]]:
  """One row per block and head: A, dt = softplus(dt_bias) and exp(-seq_len A dt)."""
  config = mqar.get_config(f'{mechanism},d_model={width},seq_len={seq_len},vocab_size=1024')
  config.attention.options.update(options)
  config.train.seed = seed
  params = api.build(config, read_data=False).state.params  # the trainer's own start
  found: Dict[str, Dict[str, np.ndarray]] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = [str(getattr(k, 'key', k)) for k in path]
    if names[-1] in ('A_log', 'dt_bias'):
      found.setdefault('/'.join(names[:-2]), {})[names[-1]] = np.asarray(leaf, np.float64)
  rows = []
  for block, (where, p) in enumerate(sorted(found.items())):
    a, dt = np.exp(p['A_log']), np.logaddexp(0.0, p['dt_bias'])
    for head, (a_h, dt_h) in enumerate(zip(a, dt)):
      rows.append(
        dict(
          mechanism=mechanism,
          width=width,
          seed=seed,
          block=block,
          head=head,
          layer=where,
          A=float(a_h),
          dt=float(dt_h),
          kept=float(np.exp(-seq_len * a_h * dt_h)),
          seq_len=seq_len,
          options=dict(options),
        )
      )
  return rows


def parse_options(items: Sequence[str]) -> Dict[str, Any]:
  out = {}
  for item in items:
    key, sep, value = item.partition('=')
    if not sep:
      raise app.UsageError(f'--options item {item!r} is not key=value')
    try:
      out[key] = float(value)
    except ValueError:
      out[key] = value
  return out


def main(argv):
  del argv
  options = parse_options(_OPTIONS.value)
  rows = [
    r
    for m in _MECHANISMS.value
    for w in _WIDTHS.value
    for s in _SEEDS.value
    for r in decays(m, int(w), int(s), _SEQ_LEN.value, options)
  ]
  path = os.path.join(_OUT.value, f'{_NAME.value}.json')
  os.makedirs(_OUT.value, exist_ok=True)
  with open(path, 'w') as f:
    json.dump(
      dict(
        command='python -m studies.recall.decay_init '
        + ' '.join(
          f'--{k}={",".join(v) if isinstance(v, list) else v}'
          for k, v in (
            ('mechanisms', _MECHANISMS.value),
            ('widths', _WIDTHS.value),
            ('seeds', _SEEDS.value),
            ('seq_len', _SEQ_LEN.value),
            ('options', _OPTIONS.value),
          )
          if v
        )
        + f' --out={_OUT.value} --name={_NAME.value}',
        rows=rows,
      ),
      f,
      indent=1,
    )
  for r in rows:
    print(
      f"{r['mechanism']} width {r['width']} seed {r['seed']} block {r['block']} head "
      f"{r['head']}: A {r['A']:.2f}, dt {r['dt']:.4f}, keeps {r['kept']:.3f} over "
      f"{r['seq_len']} tokens"
    )
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)

r"""The table and plot of the LoRA rank study (Hu et al. 2021), read from a finished sweep.

The study's runs are made by the sweep tool (`sweeps/lora_digits.py`,
`studies/lora_mnist/sweep.py`; the runs are listed by
`configs/lora_base.study_runs`): a base classifier trained on plain images
(`base`), and for each transformed variant (rotated, inverted, quantised) full
fine-tuning of the base (`full_<variant>`), LoRA fine-tuning of the frozen
base at each rank (`finetune_<variant>_r<r>`) and LoRA-only training of a
random frozen base (`scratch_<variant>_r<r>`). This tool reads their
`results.json`, evaluates the base itself on each variant (no adaptation), and
writes `<out>/<name>.md`, `.json` and `.png` (accuracy against the rank).

    python -m train.sweep --sweep=sweeps/lora_digits.py --root=runs/lora_digits run
    python -m benchmarks.lora_table --root=runs/lora_digits --out=benchmark_results/lora_digits

Several roots (`--root=runs/s0,runs/s1`), each the whole study with another
`train.seed`, give one table of means with their spread (half the range).

Runs that have not finished are left out of the table (named in its notes).
"""

import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import flags
from etils import epath

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import runs
from train import api

MODES = (
  ('finetune', 'Fine-tuning the base with LoRA'),
  ('scratch', 'LoRA only, from scratch (random frozen base)'),
)
_RUN = re.compile(r'^(full|finetune|scratch)_([a-z]+?)(?:_r(\d+))?$')


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_list(
    'root',
    None,
    'the sweep root holding base/, full_<v>/, ...; several '
    '(comma-separated), one per seed, give means and spreads',
    flag_values=fv,
  )
  common.define_output_flags(fv, out='benchmark_results/lora', name='lora')
  flags.mark_flag_as_required('root', flag_values=fv)


def _results(workdir) -> Optional[Dict[str, Any]]:
  return runs.read_json(epath.Path(workdir) / 'results.json')


def evaluate_on(workdir: str, variant: str) -> float:
  """Accuracy of `workdir`'s newest checkpoint on its eval split, with `variant` images."""
  config = api.stored_config(workdir)
  config.dataset.transform = variant
  run = api.build(config)
  _, params = run.restore_params(workdir)
  return run.evaluate(params)['accuracy']


def collect(root: str) -> Dict[str, Any]:
  """Every finished run of the study under `root`, and the base on each variant."""
  base = _results(epath.Path(root) / 'base')
  if base is None:
    raise FileNotFoundError(
      f'{root}/base has no results.json: run the sweep first '
      '(python -m train.sweep --sweep=... --root=... run)'
    )
  base_config = runs.read_json(epath.Path(root) / 'base' / 'config.json')
  result: Dict[str, Any] = dict(
    root=os.path.abspath(root) if api.is_local(root) else root,
    device=machine.device_info(),
    dataset=base_config['dataset']['name'],
    model=base_config['model']['kind'],
    seeds=[(base_config.get('train') or {}).get('seed')],
    eval_split=base_config['dataset']['eval_split'],
    base={'plain': base['eval_accuracy']},
    full_finetune={},
    finetune={},
    scratch={},
    params={'base': base['params_total']},
    steps={'base': base['steps']},
    unfinished=[],
  )
  ranks, variants = set(), set()
  for name in sorted(p.name for p in epath.Path(root).iterdir()):
    match = _RUN.match(name)
    if not match:
      continue
    mode, variant, rank = match.group(1), match.group(2), match.group(3)
    res = _results(epath.Path(root) / name)
    if res is None:
      result['unfinished'].append(name)
      continue
    variants.add(variant)
    if mode == 'full':
      result['full_finetune'][variant] = res['eval_accuracy']
      result['params']['full'] = res['params_trainable']
    else:
      ranks.add(int(rank))
      result[mode].setdefault(rank, {})[variant] = res['eval_accuracy']
      result['params'][f'r{rank}'] = res['params_trainable']
      result['steps']['adaptation'] = res['steps']
  result['ranks'], result['variants'] = sorted(ranks), sorted(variants)
  for variant in result['variants']:
    result['base'][variant] = evaluate_on(os.fspath(epath.Path(root) / 'base'), variant)
  return result


ACCURACIES = ('base', 'full_finetune', 'finetune', 'scratch')
SAME = ('dataset', 'model', 'eval_split', 'ranks', 'variants', 'params', 'steps')


def combine(results: List[Dict[str, Any]]) -> Dict[str, Any]:
  """collect() of several seeds -> one result: every accuracy the mean over the seeds, its
  half-range under result['spread'] (same layout), the seeds' results under 'per_seed'. A
  cell some seed has not finished is left out (its runs are listed as unfinished), never a
  mean of fewer seeds. Raises ValueError when the roots are not one study."""
  first = results[0]
  for r in results[1:]:
    for key in SAME:
      if r[key] != first[key]:
        raise ValueError(
          f"--root={r['root']}: its {key} {r[key]!r} is not that of "
          f"--root={first['root']} ({first[key]!r}); only seeds of one study "
          f'combine'
        )
  out = dict(
    first,
    root=', '.join(r['root'] for r in results),
    seeds=[s for r in results for s in r['seeds']],
    unfinished=[f"{r['root']}/{n}" for r in results for n in r['unfinished']],
    spread={},
    per_seed=results,
  )
  for key in ACCURACIES:
    out[key], out['spread'][key] = _mean_spread([r[key] for r in results])
  return out


def _mean_spread(trees: List[Any]) -> Tuple[Any, Any]:
  """Nested dicts with float leaves -> (mean, half-range) trees over the keys all share."""
  if isinstance(trees[0], dict):
    keys = sorted(set.intersection(*(set(t) for t in trees)))
    pairs = {k: _mean_spread([t[k] for t in trees]) for k in keys}
    return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
  return runs.mean_spread(trees)


def _cell(result: Dict[str, Any], key: str, *path: str) -> Optional[str]:
  """The accuracy at result[key][path...] as a percentage, with ' ±spread' over seeds."""
  value, spread = result[key], result.get('spread', {}).get(key)
  for p in path:
    value = (value or {}).get(p)
    spread = None if spread is None else spread.get(p)
  if value is None:
    return None
  return _pct(value) + ('' if spread is None else f' ±{100 * spread:.2f}')


def _pct(x: Optional[float]) -> Optional[str]:
  return None if x is None else f'{100 * x:.2f}%'


def markdown(result: Dict[str, Any], command: str = '') -> str:
  variants, split = result['variants'], result['eval_split']
  notes = [
    f"dataset {result['dataset']}, model {result['model']} "
    f"({output.fmt_count(result['params']['base'])} parameters); runs in "
    f"{result['root']}",
    f"base: {result['steps']['base']} steps on plain images, {split} accuracy "
    f"{_cell(result, 'base', 'plain')}",
    f"every adaptation run: {result['steps'].get('adaptation')} steps",
    f'accuracy on the {split} split; trainable params = LoRA adapters '
    '(r x (in + out) per adapted layer)',
  ]
  if len(result['seeds']) > 1:
    notes.append(
      f"{len(result['seeds'])} seeds ({', '.join(map(str, result['seeds']))}), "
      'one root each: every cell is the mean over the seeds, ± half the range'
    )
  if result['unfinished']:
    notes.append('not finished, left out: ' + ', '.join(result['unfinished']))
  if command:
    notes.append(f'command: `{command}`')
  text = output.header('LoRA rank study', machine.describe_device(result['device']), notes)
  rows = [['base, not adapted', 0] + [_cell(result, 'base', v) for v in variants]]
  if result['full_finetune']:
    rows.append(
      ['full fine-tuning', output.fmt_count(result['params'].get('full'))]
      + [_cell(result, 'full_finetune', v) for v in variants]
    )
  text += '\n## Baselines\n\n' + output.table(['', 'trainable params'] + variants, rows) + '\n'
  for mode, title in MODES:
    if not result[mode]:
      continue
    rows = [
      [r, output.fmt_count(result['params'].get(f'r{r}'))]
      + [_cell(result, mode, str(r), v) for v in variants]
      for r in result['ranks']
    ]
    text += f'\n## {title}\n\n' + output.table(['r', 'trainable params'] + variants, rows) + '\n'
  return text


def plot(path: str, result: Dict[str, Any]) -> str:
  """Accuracy against r, a panel per mode, a line per variant (error bars: the spread over
  seeds); dashed: full fine-tuning."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top  (Agg via output)

  modes = [(m, t) for m, t in MODES if result[m]]
  fig, axes = plt.subplots(
    1, max(len(modes), 1), figsize=(5.6 * max(len(modes), 1), 4.2), squeeze=False, sharey=True
  )
  for ax, (mode, title) in zip(axes[0], modes):
    spread = result.get('spread', {}).get(mode)
    for i, v in enumerate(result['variants']):
      color = f'C{i}'
      accs = [result[mode].get(str(r), {}).get(v) for r in result['ranks']]
      errors = (
        None if spread is None else [np_nan(spread.get(str(r), {}).get(v)) for r in result['ranks']]
      )
      ax.errorbar(
        result['ranks'],
        [np_nan(a) for a in accs],
        yerr=errors,
        marker='os^vD'[i % 5],
        color=color,
        capsize=2,
        label=v,
      )
      if v in result['full_finetune']:
        ax.axhline(
          result['full_finetune'][v],
          color=color,
          linestyle='--',
          linewidth=1,
          label=f'{v}, full fine-tuning',
        )
      ax.axhline(
        result['base'][v], color=color, linestyle=':', linewidth=1, label=f'{v}, base not adapted'
      )
    ax.set_xscale('log', base=2)
    ax.set_xticks(result['ranks'], [str(r) for r in result['ranks']])
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel('rank r')
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc='lower right')
  axes[0][0].set_ylabel(f"{result['eval_split']} accuracy")
  fig.suptitle(f"LoRA: {result['dataset']}, {result['model']}", fontsize=9)
  return output.save_figure(fig, path)


def np_nan(x: Optional[float]) -> float:
  return float('nan') if x is None else x


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  fv = common.parse_flags(define_flags, argv, __doc__)
  args = list(sys.argv[1:] if argv is None else argv)
  command = ' '.join(['python -m benchmarks.lora_table'] + args)
  try:
    result = [collect(root) for root in fv.root]
    result = combine(result) if len(result) > 1 else result[0]
  except (FileNotFoundError, ValueError) as e:  # a root without a study, or roots of two
    raise SystemExit(str(e)) from None
  plot(os.path.join(fv.out, f'{fv.name}.png'), result)
  output.finish(fv.out, fv.name, result, markdown(result, command), quiet=fv.quiet)
  return result


if __name__ == '__main__':
  main()

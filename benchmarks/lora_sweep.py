r"""The LoRA rank sweep of the "Efficient Attention" report (section 2.1), end to end.

Trains the base classifier on plain images once (or takes --base_workdir),
evaluates it on each transformed variant, fine-tunes it fully (the baseline)
and with LoRA at every rank, and trains LoRA-only models from scratch; then
writes one table: r | trainable params | quantised | rotated | inverted (test
accuracy), for fine-tuning and for scratch, as <out>/<name>.md and .json, and
<out>/<name>.png (accuracy against r).

    python -m benchmarks.lora_sweep --dataset=digits --root=runs/lora_digits \
        --out=benchmark_results/lora_digits                # offline, a few minutes
    python -m benchmarks.lora_sweep --dataset=mnist --root=runs/lora_mnist \
        --base_workdir=runs/lora_base_mnist_mlp            # needs TFDS MNIST

Every run goes through the trainer (`configs/lora_base.py`,
`lora_finetune.py`, `lora_scratch.py`) in <root>/<name>; a run whose workdir
has results.json is not repeated, so re-running the command resumes the
sweep. --steps shortens every adaptation run (0: the configs' length);
--set key=value overrides any config field of every run (repeatable).
"""
import argparse
import os
import sys
import time
from typing import Any, Dict, Optional, Sequence

from benchmarks import common
from benchmarks import output
from configs import lora_base
from configs import lora_finetune
from configs import lora_scratch
from train import input_pipeline
from train import sharding
from train import steps as steps_lib
from train import tasks
from train import trainer

MODES = ('finetune', 'scratch')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--dataset', default='digits', choices=lora_base.DATASETS)
  p.add_argument('--model', default='mlp', choices=lora_base.MODELS)
  p.add_argument('--ranks', default='1,2,4,8,16,32,64', help='comma list')
  p.add_argument('--variants', default='quantised,rotated,inverted', help='comma list')
  p.add_argument('--modes', default=','.join(MODES), help='comma list of ' + ', '.join(MODES))
  p.add_argument('--root', default='runs/lora_sweep', help='parent of the run workdirs')
  p.add_argument('--base_workdir', default='', help='a trained base (default: train one '
                 'in <root>/base)')
  p.add_argument('--base_steps', type=int, default=0, help='base training steps (0: config)')
  p.add_argument('--steps', type=int, default=0, help='steps of each adaptation run (0: config)')
  p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                 help='config override for every run, e.g. optim.learning_rate=0.003')
  p.add_argument('--out', default='benchmark_results/lora_sweep', help='output directory')
  p.add_argument('--name', default='lora_sweep', help='file name stem of the outputs')
  p.add_argument('--quiet', action='store_true')
  return p.parse_args(argv)


def _configure(config, args, steps: int):
  """Applies --steps (if > 0) and --set to a run's config."""
  if steps > 0:
    config.train.update(dict(num_steps=steps, num_epochs=-1, checkpoint_every=steps,
                             log_every=min(config.train.log_every, steps)))
  config.train.keep_checkpoints = 1
  for item in args.set:
    key, _, value = item.partition('=')
    *groups, field = key.split('.')
    target = config
    for g in groups:
      target = target[g]
    target[field] = common.parse_value(value)
  return config


def _train(config, workdir: str, args) -> Dict[str, Any]:
  start = time.time()
  results = trainer.train_and_evaluate(config, workdir)
  if results is None:
    raise RuntimeError(f'run {workdir} was stopped by a signal; re-run to resume')
  if not args.quiet:
    print(f"{os.path.basename(workdir)}: test accuracy {results['eval_accuracy']:.4f}, "
          f"{results['params_trainable']:,} trainable ({time.time() - start:.1f} s)",
          flush=True)
  return results


def evaluate_on(workdir: str, variant: str) -> float:
  """Test accuracy of `workdir`'s checkpoint on `variant` images (no adaptation)."""
  config = trainer.load_config(workdir)
  config.dataset.transform = variant
  mesh = sharding.create_mesh()
  _, model, params = trainer.load_model_and_params(workdir, mesh)
  task = tasks.get_task(config.task)
  values = trainer.run_eval(steps_lib.make_eval_step(task, model, mesh), params,
                            input_pipeline.get_eval_data(config), mesh)
  return values['accuracy']


def run(args, command: str = '') -> Dict[str, Any]:
  ranks = common.csv_list(args.ranks, int)
  variants = common.csv_list(args.variants)
  modes = common.csv_list(args.modes)
  bad = sorted(set(modes) - set(MODES))
  if bad:
    raise ValueError(f'--modes: unknown {bad}; valid: {", ".join(MODES)}')
  data, model = args.dataset, args.model
  result: Dict[str, Any] = dict(
      config=vars(args), device=common.device_info(), ranks=ranks, variants=variants,
      modes=modes, command=command,
      base={}, full_finetune={}, finetune={}, scratch={}, params={}, steps={})
  base = args.base_workdir
  if not base:
    base = os.path.join(args.root, 'base')
    res = _train(_configure(lora_base.get_config(f'{data},{model}'), args, args.base_steps),
                 base, args)
    result['params']['base'] = res['params_total']
    result['base']['plain'] = res['eval_accuracy']
    result['steps']['base'] = res['steps']
  result['base_workdir'] = os.path.abspath(base)
  for variant in variants:
    result['base'][variant] = evaluate_on(base, variant)
    if 'finetune' in modes:
      res = _train(_configure(lora_finetune.get_config(f'{variant},0,{data},{model},base={base}'),
                              args, args.steps),
                   os.path.join(args.root, f'full_{variant}'), args)
      result['full_finetune'][variant] = res['eval_accuracy']
      result['params']['full'] = res['params_trainable']
    for mode in modes:
      for r in ranks:
        arg = f'{variant},{r},{data},{model}'
        config = (lora_finetune.get_config(f'{arg},base={base}') if mode == 'finetune'
                  else lora_scratch.get_config(arg))
        res = _train(_configure(config, args, args.steps),
                     os.path.join(args.root, f'{mode}_{variant}_r{r}'), args)
        result[mode].setdefault(str(r), {})[variant] = res['eval_accuracy']
        result['steps']['adaptation'] = res['steps']
        result['params'][f'r{r}'] = res['params_trainable']
  return result


def _pct(x: Optional[float]) -> Optional[str]:
  return None if x is None else f'{100 * x:.2f}%'


def _count(n: Optional[int]) -> Optional[str]:
  return None if n is None else f'{n:,}'


def markdown(result: Dict[str, Any]) -> str:
  cfg, variants = result['config'], result['variants']
  notes = [f"dataset {cfg['dataset']}, model {cfg['model']} "
           f"({_count(result['params'].get('full') or result['params'].get('base'))} "
           f"parameters), "
           f"base {result['base_workdir']}",
           (f"base trained here: {result['steps']['base']} steps on plain images, test "
            f"accuracy {_pct(result['base']['plain'])}" if 'plain' in result['base']
            else 'base given by --base_workdir'),
           f"every adaptation run (LoRA and full fine-tuning): "
           f"{result['steps'].get('adaptation')} steps"
           + (f"; overrides {', '.join(cfg['set'])}" if cfg['set'] else ''),
           'test accuracy; trainable params = LoRA adapters (r x (in + out) per adapted '
           'layer)',
           f"command: `{result['command']}`"]
  text = output.header('LoRA rank sweep', common.describe_device(result['device']), notes)
  rows = [['base, not adapted', 0] + [_pct(result['base'].get(v)) for v in variants]]
  if result['full_finetune']:
    rows.append(['full fine-tuning', _count(result['params'].get('full'))] +
                [_pct(result['full_finetune'].get(v)) for v in variants])
  text += '\n## Baselines\n\n' + output.table(['', 'trainable params'] + variants, rows) + '\n'
  for mode, title in (('finetune', 'Fine-tuning the base with LoRA'),
                      ('scratch', 'LoRA only, from scratch (random frozen base)')):
    if mode not in result['modes']:
      continue
    rows = [[r, _count(result['params'].get(f'r{r}'))] +
            [_pct(result[mode].get(str(r), {}).get(v)) for v in variants]
            for r in result['ranks']]
    text += f'\n## {title}\n\n' + output.table(['r', 'trainable params'] + variants,
                                               rows) + '\n'
  return text


def plot(path: str, result: Dict[str, Any]) -> str:
  """Accuracy against r, a panel per mode, a line per variant; dashed: full fine-tuning."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top  (Agg via output)
  modes = [(m, t) for m, t in (('finetune', 'LoRA fine-tuning of the base'),
                                ('scratch', 'LoRA only, from scratch')) if m in result['modes']]
  fig, axes = plt.subplots(1, len(modes), figsize=(5.6 * len(modes), 4.2), squeeze=False,
                           sharey=True)
  for ax, (mode, title) in zip(axes[0], modes):
    for i, v in enumerate(result['variants']):
      color = f'C{i}'
      accs = [result[mode].get(str(r), {}).get(v) for r in result['ranks']]
      ax.plot(result['ranks'], accs, marker='os^vD'[i % 5], color=color, label=v)
      if v in result['full_finetune']:
        ax.axhline(result['full_finetune'][v], color=color, linestyle='--', linewidth=1,
                   label=f'{v}, full fine-tuning')
    ax.set_xscale('log', base=2)
    ax.set_xticks(result['ranks'], [str(r) for r in result['ranks']])
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel('rank r')
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc='lower right')
  axes[0][0].set_ylabel('test accuracy')
  fig.suptitle(f"{result['config']['dataset']}, {result['config']['model']}: "
               f"{common.describe_device(result['device'])}", fontsize=9)
  return output.save_figure(fig, path)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args = parse_args(argv)
  command = ' '.join(['python -m benchmarks.lora_sweep'] +
                     list(argv if argv is not None else sys.argv[1:]))
  result = run(args, command)
  plot(os.path.join(args.out, f'{args.name}.png'), result)
  output.finish(args.out, args.name, result, markdown(result), quiet=args.quiet)
  return result


if __name__ == '__main__':
  main()

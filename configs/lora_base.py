"""The LoRA study's base classifier ("Efficient Attention" report, section 2.1).

Trained on plain images; `lora_finetune.py` adapts it to a transformed variant
(rotated, inverted, quantised) and `lora_scratch.py` trains LoRA-only models.
Arguments (in order, or key=value): dataset ('mnist' | 'digits'), model
('mlp' | 'vit'), variant (a `data.transforms` variant the base is trained
on; '' = plain images).

    --config=configs/lora_base.py               MNIST 28x28, MLP 784-64-64-10 (55,050 params)
    --config=configs/lora_base.py:digits        digits 8x8, MLP 64-64-64-10 (8,970), offline
    --config=configs/lora_base.py:mnist,vit     MNIST 28x28, ViT (patch 4, 49 tokens)
"""

from configs import common
from configs import presets

DATASETS = ('mnist', 'digits')
VARIANTS = ('quantised', 'rotated', 'inverted')  # the transformed data the base is adapted to
MODELS = ('mlp', 'vit')


def study(dataset: str, model: str):
  """The shared data, model, optimiser and LoRA targets of the study's runs."""
  if dataset not in DATASETS or model not in MODELS:
    raise ValueError(
      f'LoRA study dataset={dataset!r}, model={model!r}; valid: dataset '
      f'{", ".join(DATASETS)}, model {", ".join(MODELS)}'
    )
  config = common.base()
  if dataset == 'mnist':
    presets.mnist(config)
    config.dataset.update(dict(image_size=28, batch_size=128, eval_batch_size=1000))
  else:
    presets.digits(config)
    config.dataset.update(dict(batch_size=64, eval_batch_size=360))
  if model == 'mlp':  # every layer adapted, the head included
    config.model.update(dict(kind='mlp', depth=2, mlp_dim=64))
    config.lora.targets = 'all'
  else:  # attention + Transformer MLP + the (zero-initialised) head
    config.model.update(
      dict(
        kind='vit',
        d_model=64,
        depth=2,
        num_heads=4,
        mlp_dim=128,
        patch_size=4 if dataset == 'mnist' else 2,
        pool='mean',
      )
    )
    config.lora.targets = 'default,head'
  config.optim.update(dict(learning_rate=2e-3, warmup_steps=50, weight_decay=1e-4))
  if dataset == 'mnist':
    config.train.update(dict(num_epochs=5, log_every=100, checkpoint_every=2000))
  else:
    config.train.update(dict(num_steps=600, log_every=100, checkpoint_every=600))
  return config


def get_config(arg=None):
  args = common.parse_arg(arg, dataset='mnist', model='mlp', variant='')
  config = study(args['dataset'], args['model'])
  config.dataset.transform = args['variant']
  return config


RANKS = (1, 2, 4, 8, 16, 32, 64)


def study_runs(dataset: str, model: str = 'mlp', ranks=RANKS, variants=VARIANTS):
  """The sweep runs of the whole study (for `train/sweep.py`), named as
  `benchmarks/lora_table.py` reads them: base, full_<v>, finetune_<v>_r<r>,
  scratch_<v>_r<r>; the fine-tuning runs start from '{root}/base'."""
  tail = f'{dataset},{model}'
  base = 'base={root}/base'
  runs = [dict(name='base', config=f'configs/lora_base.py:{tail}')]
  for v in variants:
    runs.append(dict(name=f'full_{v}', config=f'configs/lora_finetune.py:{v},0,{tail},{base}'))
    runs += [
      dict(name=f'finetune_{v}_r{r}', config=f'configs/lora_finetune.py:{v},{r},{tail},{base}')
      for r in ranks
    ]
    runs += [
      dict(name=f'scratch_{v}_r{r}', config=f'configs/lora_scratch.py:{v},{r},{tail}')
      for r in ranks
    ]
  return runs

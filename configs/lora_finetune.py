"""LoRA fine-tuning of the study's base classifier on a transformed variant.

Arguments (in order, or key=value): variant ('rotated' | 'inverted' |
'quantised'), rank (0: full fine-tuning, every parameter trained), dataset
('mnist' | 'digits'), model ('mlp' | 'vit'), base (the base run's workdir;
default runs/lora_base_<dataset>_<model>). The base is frozen (loaded with
`lora.load_base`, which fails if the checkpoint does not fit); only the
adapters train.

    python main.py --config=configs/lora_base.py --workdir=runs/lora_base_mnist_mlp
    python main.py --config=configs/lora_finetune.py:rotated,8 --workdir=runs/ft_rotated_r8
    python main.py --config=configs/lora_finetune.py:rotated,0 --workdir=runs/ft_rotated_full
    python main.py --config=configs/lora_finetune.py:inverted,4,digits --workdir=...
"""

from configs import common
from configs import lora_base


def get_config(arg=None):
  args = common.parse_arg(arg, variant='rotated', rank=8, dataset='mnist', model='mlp', base='')
  config = lora_base.study(args['dataset'], args['model'])
  config.dataset.transform = args['variant']
  config.lora.rank = args['rank']
  config.init_from = args['base'] or f"runs/lora_base_{args['dataset']}_{args['model']}"
  return config

"""LoRA-only training from scratch: a random, frozen base plus rank-r adapters.

Does a model of low intrinsic rank suffice (report section 2.1.3)? Only the
adapters train; their targets include the classifier head (for the ViT it is
zero-initialised, so without an adapter its output would stay zero).
Arguments as `lora_finetune.py` without base: variant, rank (>= 1), dataset,
model.

    --config=configs/lora_scratch.py:quantised,16
    --config=configs/lora_scratch.py:rotated,4,digits
"""

from configs import common
from configs import lora_base


def get_config(arg=None):
  args = common.parse_arg(arg, variant='rotated', rank=8, dataset='mnist', model='mlp')
  if args['rank'] < 1:
    raise ValueError(f"lora_scratch needs rank >= 1, got {args['rank']}")
  config = lora_base.study(args['dataset'], args['model'])
  config.dataset.transform = args['variant']
  config.lora.rank = args['rank']
  return config

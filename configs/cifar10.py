"""CIFAR-10 ViT for comparing attention mechanisms.

32x32 images in 2x2 patches: 256 tokens, mean-pooled, so mechanisms that are
linear in the length have something to save. The argument picks the mechanism
(any registered one; its options are its declared defaults, overridable with
--config.attention.options.<name>=...), the projection scheme and the size:

  base: d_model 128, 4 layers, 4 heads, 100 epochs;
  small: d_model 64, 2 layers, 4 heads, 5 epochs (the equal-budget comparison
    that fits a laptop CPU).

    --config=configs/cifar10.py:nystrom          (or configs/cifar10_nystrom.py)
    --config=configs/cifar10.py:mechanism=local,projection=efficient,size=small
"""

from configs import common
from configs import presets

SIZES = {
  'base': dict(d_model=128, depth=4, num_heads=4, mlp_dim=256, num_epochs=100),
  'small': dict(d_model=64, depth=2, num_heads=4, mlp_dim=128, num_epochs=5),
}


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='softmax', projection='standard', size='base')
  if args['size'] not in SIZES:
    raise ValueError(
      f"configs/cifar10.py: size={args['size']!r} is not valid; valid choices: {', '.join(SIZES)}"
    )
  size = dict(SIZES[args['size']])
  num_epochs = size.pop('num_epochs')
  config = presets.cifar10(common.base())
  config.model.update(dict(kind='vit', patch_size=2, pool='mean', dropout_rate=0.1, **size))
  common.set_attention(config, args['mechanism'], args['projection'])
  config.dataset.batch_size = 128
  config.dataset.eval_batch_size = 1000
  config.optim.update(dict(learning_rate=1e-3, warmup_steps=1000, weight_decay=5e-2))
  config.train.update(
    dict(num_epochs=num_epochs, log_every=100, eval_every=3900, checkpoint_every=3900)
  )
  return config

"""CIFAR-100 ViT of Hosseini & Hosseini (2024): d_model 256, 8 layers.

2x2 patches and a cls token: 257 tokens, the context length that reproduces
the paper's per-layer parameter counts (super: 197,890). 8 heads (the paper's
best row). The argument picks the projection scheme:

    --config=configs/cifar100.py:super
"""

from configs import common
from configs import presets


def get_config(arg=None):
  args = common.parse_arg(arg, projection='standard', mechanism='softmax')
  config = presets.cifar100(common.base())
  config.model.update(
    dict(
      kind='vit',
      d_model=256,
      depth=8,
      num_heads=8,
      mlp_dim=512,
      patch_size=2,
      pool='cls',
      dropout_rate=0.1,
    )
  )
  common.set_attention(config, args['mechanism'], args['projection'])
  config.dataset.batch_size = 256
  config.dataset.eval_batch_size = 1000
  config.optim.update(dict(learning_rate=1e-3, warmup_steps=1000, weight_decay=1e-4))
  config.train.update(dict(num_epochs=100, log_every=100, eval_every=1950, checkpoint_every=1950))
  return config

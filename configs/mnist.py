"""MNIST ViT of Hosseini & Hosseini (2024), "You Need to Pay Better Attention": d_model
128, 2 layers, 4 heads.

Images are resized to 32x32 and cut into 4x4 patches: 64 tokens, mean-pooled,
so the super projection's W_A is 64 x 64 as in the paper's parameter counts.
The argument picks the projection scheme:

    --config=configs/mnist.py:super
"""

from configs import common
from configs import presets


def get_config(arg=None):
  args = common.parse_arg(arg, projection='standard', mechanism='softmax')
  config = presets.mnist(common.base())
  config.model.update(
    dict(kind='vit', d_model=128, depth=2, num_heads=4, mlp_dim=256, patch_size=4, pool='mean')
  )
  common.set_attention(config, args['mechanism'], args['projection'])
  config.dataset.batch_size = 128
  config.dataset.eval_batch_size = 1000
  config.optim.update(dict(learning_rate=1e-3, warmup_steps=500, weight_decay=1e-4))
  config.train.update(dict(num_epochs=10, log_every=100, eval_every=2000, checkpoint_every=2000))
  return config

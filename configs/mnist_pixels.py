"""Autoregressive MNIST at 28x28 = 784 steps (Katharopoulos et al. 2020, section 4.2.1).

Their architecture: 8 layers, 8 heads, d_model 256, feed-forward 1024, pixels
as 256-way tokens; they train 250 epochs (lr 1e-4). Bits per dim is the
metric to compare; samples and completions are written at the end.

    --config=configs/mnist_pixels.py:linear
    --config=configs/mnist_pixels.py:softmax --config.train.num_epochs=10
"""

from configs import common
from configs import presets


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='linear')
  config = presets.pixel_lm(presets.mnist(common.base()))
  config.model.update(dict(d_model=256, depth=8, num_heads=8, mlp_dim=1024))
  common.set_attention(config, args['mechanism'])
  config.dataset.batch_size = 32
  config.dataset.eval_batch_size = 250
  config.optim.update(dict(learning_rate=1e-4, warmup_steps=1000, weight_decay=0.0))
  config.train.update(dict(num_epochs=250, log_every=500, eval_every=20_000, checkpoint_every=5000))
  return config

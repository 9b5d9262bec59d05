"""Byte-level IMDB sentiment classification (the LRA text task).

Reviews are read as UTF-8 bytes (ids 1..256, 0 = padding), truncated or padded
to `max_length`; 4 layers, d_model 256, 4 heads, mean pooling. The argument
picks the mechanism, projection and length:

    --config=configs/imdb.py:linear,max_length=4096
"""

from configs import common
from configs import presets


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='softmax', projection='standard', max_length=1024)
  config = presets.imdb(common.base(), max_length=args['max_length'])
  config.model.update(
    dict(
      kind='text', d_model=256, depth=4, num_heads=4, mlp_dim=1024, pool='mean', dropout_rate=0.1
    )
  )
  common.set_attention(config, args['mechanism'], args['projection'])
  config.dataset.batch_size = 32
  config.dataset.eval_batch_size = 256
  config.optim.update(dict(learning_rate=5e-4, warmup_steps=1000, weight_decay=1e-2))
  config.train.update(dict(num_steps=20_000, log_every=100, eval_every=2000, checkpoint_every=2000))
  return config

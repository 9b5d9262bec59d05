"""Autoregressive pixel model on the 8x8 digits (offline, 64 steps, about a minute on 2 CPUs).

Pixels are tokens 0..255 (the digits' 17 levels rescaled), predicted in
raster order by a small causal Transformer; at the end `samples.png` and
`samples_completion.png` land in the workdir. The argument picks the mechanism
(one that can decode, which the samples need: linear, softmax, rfa, performer, local,
softmax_chunked; `efficient_attn.layers.decoding.decodable_mechanisms()` lists them all):

    --config=configs/digits_pixels.py:linear
"""

from configs import common
from configs import presets


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='linear')
  config = presets.pixel_lm(presets.digits(common.base()))
  config.model.update(dict(d_model=64, depth=2, num_heads=4, mlp_dim=128))
  common.set_attention(config, args['mechanism'])
  config.dataset.batch_size = 32
  config.dataset.eval_batch_size = 360
  config.optim.update(dict(learning_rate=3e-3, warmup_steps=50, weight_decay=1e-4))
  config.train.update(dict(num_steps=600, log_every=100, eval_every=-1, checkpoint_every=600))
  return config

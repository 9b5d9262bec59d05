"""Long Range Arena ListOps (Tay et al. 2021): the value of a nested MIN/MAX/MED/SUM_MOD expression.

Generated here (`data/listops.py`, LRA's algorithm), written
once to ~/.cache/efficient_attn/lra/listops. The argument picks the mechanism,
projection and size:

  base: LRA's setting (its paper's appendix; its code's base_listops_config.py has 4
    layers and MLP 1024): expressions of 500-2,000 tokens, 96,000 / 2,000 / 2,000
    examples; 6 layers, width 512, 8 heads, MLP 2048, fixed sinusoidal positions, mean
    pooling (LRA: CLS, but one more token makes the length one that block mechanisms
    cannot tile); batch 32,
    5,000 steps. LRA's optimiser is Adam at 0.05 with linear warm-up over 1,000
    steps and rsqrt decay, weight decay 0.1; here AdamW peaks at LRA's rate at
    the end of warm-up (0.05 / sqrt(1000) = 1.58e-3) and decays by cosine.
  small: the same task on 10,000 / 1,000 / 1,000 shorter expressions (64-256
    tokens); 2 layers, width 64, 4 heads, MLP 128; 1,000 steps, which fits this
    project's CPU comparisons (at 500 tokens a softmax step takes 0.8 s on one core).

    --config=configs/lra/listops.py:linear
    --config=configs/lra/listops.py:mechanism=nystrom,size=small
"""

from configs import common
from configs import presets

SIZES = {
  'base': dict(
    model=dict(d_model=512, depth=6, num_heads=8, mlp_dim=2048),
    data=dict(sizes=None, min_length=500, max_length=2000),
    num_steps=5000,
    eval_batch_size=256,
  ),
  'small': dict(
    model=dict(d_model=64, depth=2, num_heads=4, mlp_dim=128),
    data=dict(
      sizes={'train': 10_000, 'validation': 1000, 'test': 1000}, min_length=64, max_length=256
    ),
    num_steps=1000,
    eval_batch_size=250,
  ),
}


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='softmax', projection='standard', size='base')
  size = common.size_preset('configs/lra/listops.py', SIZES, args['size'])
  config = presets.listops(common.base(), **size['data'])
  common.lra_model(config, args['mechanism'], args['projection'], pool='mean', **size['model'])
  common.fit_blocks(config, config.dataset.max_length)
  config.dataset.batch_size = 32
  config.dataset.eval_batch_size = size['eval_batch_size']
  config.optim.update(dict(learning_rate=0.05 / 1000**0.5, warmup_steps=1000, weight_decay=0.1))
  config.train.update(
    dict(num_steps=size['num_steps'], log_every=100, eval_every=500, checkpoint_every=500)
  )
  return config

"""Long Range Arena Pathfinder (Linsley et al. 2018, as LRA uses it): are the two discs joined?

32x32 images as 1,024 pixel tokens (values 0..255, no patches), generated
here (`data/pathfinder.py`) and written once to
~/.cache/efficient_attn/lra/pathfinder. The argument picks the mechanism,
projection and size:

  base: LRA's setting: contour length 14 (hard), 160,000 / 20,000 / 20,000
    images; 1 layer, width 32, 2 heads, MLP 32, mean pooling, dropout 0.1, fixed
    sinusoidal positions;
    batch 512, 200 epochs, Adam at 1e-3, one epoch of warm-up, cosine decay, no
    weight decay. (LRA's attention width is 16 inside a width-32 model; here the
    projections keep the width.)
  small: 16x16 images (256 tokens) with 3 distractors (LRA's 10 scaled to a quarter of the
    area), contour length 6 (LRA's easy setting), 10,000 / 1,000 / 1,000 images, the
    same model; batch 64, 10 epochs (1,560 steps), which fits this project's CPU
    comparisons: at 1,024 tokens one softmax step of batch 128 takes seconds on one core.

    --config=configs/lra/pathfinder.py:performer
    --config=configs/lra/pathfinder.py:mechanism=local,size=small
"""

from configs import common
from configs import presets

SIZES = {
  'base': dict(
    data=dict(sizes=None, contour_length=14),
    batch_size=512,
    num_epochs=200,
    warmup_steps=160_000 // 512,
  ),
  'small': dict(
    data=dict(
      sizes={'train': 10_000, 'validation': 1000, 'test': 1000},
      contour_length=6,
      image_size=16,
      num_distractors=3,
    ),
    batch_size=64,
    num_epochs=10,
    warmup_steps=10_000 // 64,
  ),
}


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='softmax', projection='standard', size='base')
  size = common.size_preset('configs/lra/pathfinder.py', SIZES, args['size'])
  config = presets.pathfinder(common.base(), **size['data'])
  common.lra_model(
    config,
    args['mechanism'],
    args['projection'],
    d_model=32,
    depth=1,
    num_heads=2,
    mlp_dim=32,
    pool='mean',
  )
  config.dataset.batch_size = size['batch_size']
  config.dataset.eval_batch_size = 500
  config.optim.update(
    dict(learning_rate=1e-3, warmup_steps=size['warmup_steps'], weight_decay=0.0, grad_clip=0.0)
  )
  config.train.update(
    dict(num_epochs=size['num_epochs'], log_every=100, eval_every=-1, checkpoint_every=1000)
  )
  return config

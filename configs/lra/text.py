"""Long Range Arena Text: byte-level IMDB sentiment, reviews cut or padded to 1,000 bytes.

Bytes are tokens 1..256 (0 = padding). The argument picks the mechanism,
projection, length and size:

  base: LRA's setting (its code's base_tc_config.py; the paper's appendix says 6 layers,
    width 512, 8 heads, MLP 2048): 4 layers, width 256, 4 heads, MLP 1024, fixed sinusoidal
    positions, mean pooling (LRA: CLS, but one more token makes the length one that block mechanisms
    cannot tile);
    batch 32, 20,000 steps. LRA's optimiser is Adam at 0.05 with 8,000 warm-up
    steps and rsqrt decay, weight decay 0.1; here AdamW peaks at LRA's rate at
    the end of warm-up (0.05 / sqrt(8000) = 5.6e-4) and decays by cosine.
  small: 2 layers, width 64, 4 heads, MLP 128; 2,000 steps.

From TFDS `imdb_reviews`; for local files add --config.dataset.source=arrays
--config.dataset.data_dir=<imdb_train.npz> --config.dataset.holdout=0.1
--config.dataset.eval_split=validation.

    --config=configs/lra/text.py:linear
    --config=configs/lra/text.py:mechanism=performer,max_length=4000,size=small
"""

from configs import common
from configs import presets

SIZES = {
  'base': dict(
    model=dict(d_model=256, depth=4, num_heads=4, mlp_dim=1024), num_steps=20_000, warmup_steps=8000
  ),
  'small': dict(
    model=dict(d_model=64, depth=2, num_heads=4, mlp_dim=128), num_steps=2000, warmup_steps=400
  ),
}


def get_config(arg=None):
  args = common.parse_arg(
    arg, mechanism='softmax', projection='standard', max_length=1000, size='base'
  )
  size = common.size_preset('configs/lra/text.py', SIZES, args['size'])
  config = presets.imdb(common.base(), max_length=args['max_length'])
  common.lra_model(config, args['mechanism'], args['projection'], pool='mean', **size['model'])
  common.fit_blocks(config, config.dataset.max_length)
  config.dataset.batch_size = 32
  config.dataset.eval_batch_size = 256
  config.optim.update(
    dict(learning_rate=0.05 / 8000**0.5, warmup_steps=size['warmup_steps'], weight_decay=0.1)
  )
  config.train.update(
    dict(num_steps=size['num_steps'], log_every=100, eval_every=2000, checkpoint_every=2000)
  )
  return config

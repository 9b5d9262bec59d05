"""ImageNet ViT of Hosseini & Hosseini (2024): a reduced ViT-B/16.

8 blocks (not 12), 112x112 images, 8x8 patches (196 tokens + cls), d_model 768,
12 heads, MLP 3072. TFDS prepares imagenet2012 once from the manually
downloaded tars in `dataset.manual_dir`:

    python main.py --config=configs/imagenet.py:super --workdir=... \
      --config.dataset.manual_dir=/data/imagenet_tars --config.dataset.data_dir=/data/tfds
"""

from configs import common
from configs import presets


def get_config(arg=None):
  args = common.parse_arg(arg, projection='standard', mechanism='softmax')
  config = presets.imagenet(common.base())
  config.dataset.image_size = 112
  config.model.update(
    dict(
      kind='vit',
      d_model=768,
      depth=8,
      num_heads=12,
      mlp_dim=3072,
      patch_size=8,
      pool='cls',
      dropout_rate=0.0,
    )
  )
  common.set_attention(config, args['mechanism'], args['projection'])
  config.dataset.batch_size = 256
  config.dataset.eval_batch_size = 500
  config.optim.update(dict(learning_rate=3e-4, warmup_steps=10_000, weight_decay=5e-2, b2=0.999))
  config.train.update(
    dict(num_epochs=30, log_every=200, eval_every=5000, checkpoint_every=5000, dtype='bfloat16')
  )
  return config

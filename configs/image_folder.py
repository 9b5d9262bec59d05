"""A ViT on your own images: `root/train/<label>/*.jpg` and `root/test/<label>/*.jpg`.

    python main.py --config=configs/image_folder.py --workdir=/tmp/pets \
      --config.dataset.data_dir=/path/to/root

Read with `tfds.ImageFolder`; images are resized to 64x64 (8x8 patches), the
number of classes is the number of label folders.
"""

from configs import common
from configs import presets


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='softmax', projection='standard', image_size=64)
  config = presets.image_folder(common.base(), image_size=args['image_size'])
  config.model.update(
    dict(
      kind='vit',
      d_model=128,
      depth=4,
      num_heads=4,
      mlp_dim=256,
      patch_size=8,
      pool='cls',
      dropout_rate=0.1,
    )
  )
  common.set_attention(config, args['mechanism'], args['projection'])
  config.dataset.batch_size = 64
  config.dataset.eval_batch_size = 64
  config.optim.update(dict(learning_rate=1e-3, warmup_steps=200))
  config.train.update(dict(num_epochs=50, log_every=50, eval_every=1000, checkpoint_every=1000))
  return config

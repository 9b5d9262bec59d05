"""Long Range Arena Image: CIFAR-10 as a sequence of 1,024 grayscale pixel tokens (no patches).

Pixel values 0..255 are the tokens (LRA's setting). The argument picks the
mechanism, projection and size:

  base: LRA's setting: 1 layer, width 32, 1 head, MLP 64, mean pooling (LRA: CLS,
    but 1,025 tokens are a length block mechanisms cannot tile), dropout
    0.3, attention dropout 0.2, learned positions (LRA's CIFAR-10 setting); batch 256,
    200 epochs, Adam at 5e-4 with one epoch of warm-up and cosine decay, no weight decay.
    LRA's epoch is 45,000 images; here 10% of the training set (5,000 images,
    class-stratified) is held out for validation and the other 45,000 train.
  small: the same model for 5 epochs, which fits this project's CPU comparisons.

From TFDS; for local files add --config.dataset.source=arrays
--config.dataset.data_dir=<cifar10_train.npz>.

    --config=configs/lra/image.py:linformer
    --config=configs/lra/image.py:mechanism=softmax,size=small
"""

from configs import common
from configs import presets

SIZES = {'base': dict(num_epochs=200), 'small': dict(num_epochs=5)}


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='softmax', projection='standard', size='base')
  size = common.size_preset('configs/lra/image.py', SIZES, args['size'])
  config = presets.cifar10(common.base())
  config.dataset.update(
    dict(channels=1, pixels_as_tokens=True, augment='none', holdout=0.1, eval_split='validation')
  )
  common.lra_model(
    config,
    args['mechanism'],
    args['projection'],
    d_model=32,
    depth=1,
    num_heads=1,
    mlp_dim=64,
    pool='mean',
    dropout_rate=0.3,
    attention_dropout_rate=0.2,
    positions='learned',
  )
  config.dataset.batch_size = 256
  config.dataset.eval_batch_size = 500
  config.optim.update(
    dict(learning_rate=5e-4, warmup_steps=45_000 // 256, weight_decay=0.0, grad_clip=0.0)
  )
  config.train.update(
    dict(num_epochs=size['num_epochs'], log_every=100, eval_every=-1, checkpoint_every=1000)
  )
  return config

"""CIFAR-10 ViT for comparing attention mechanisms (the slides' benchmark).

32x32 images in 2x2 patches: 256 tokens, mean-pooled, so mechanisms that are
linear in the length (linear, rfa, performer, linformer, nystrom, local) have
something to save. d_model 128, 4 layers, 4 heads. The argument picks the
mechanism and fills its options from `common.MECHANISM_OPTIONS`:

    --config=configs/cifar10.py:nystrom     (or configs/cifar10_nystrom.py)
    --config=configs/cifar10.py:mechanism=local,projection=efficient
"""
from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='softmax', projection='standard')
  config = common.cifar10(common.base())
  config.model.update(dict(kind='vit', d_model=128, depth=4, num_heads=4, mlp_dim=256,
                           patch_size=2, pool='mean', dropout_rate=0.1))
  common.set_attention(config, args['mechanism'], args['projection'])
  config.dataset.batch_size = 128
  config.dataset.eval_batch_size = 1000
  config.optim.update(dict(learning_rate=1e-3, warmup_steps=1000, weight_decay=5e-2))
  config.train.update(dict(num_epochs=100, log_every=100, eval_every=3900,
                           checkpoint_every=3900))
  return config

"""Every mechanism on CIFAR-10 with the same ViT (seed 000's comparison)."""


def get_sweep():
  return dict(
      config='configs/cifar10_softmax.py',
      grid={'attention.mechanism': ['softmax', 'linear', 'rfa', 'performer', 'linformer',
                                    'nystrom', 'local']},
  )

"""The paper-004 MNIST study: 4 projection schemes x {1, 2, 4} heads (12 runs)."""


def get_sweep():
  return dict(
      config='configs/mnist_standard.py',
      grid={'attention.projection': ['standard', 'optimised', 'efficient', 'super'],
            'model.num_heads': [1, 2, 4]},
  )

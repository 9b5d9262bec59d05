"""The four projection schemes of Hosseini & Hosseini (2024) x {1, 2, 4} heads on MNIST
(12 runs)."""

from efficient_attn import registry


def get_sweep():
  return dict(
    grid={
      'config': [f'configs/mnist.py:{p}' for p in registry.list_projections()],
      'model.num_heads': [1, 2, 4],
    },
  )

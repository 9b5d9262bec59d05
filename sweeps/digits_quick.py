"""An offline sweep on the bundled digits: mechanism x projection, short runs."""


def get_sweep():
  return dict(
    config='configs/default.py',
    grid={
      'attention.mechanism': ['softmax', 'linear', 'nystrom'],
      'attention.projection': ['standard', 'efficient'],
    },
    fixed={'train.num_steps': 300},
  )

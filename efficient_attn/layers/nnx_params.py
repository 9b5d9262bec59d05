"""Weights between the NNX and Linen layers: the same tree under the same names.

params = to_linen_params(nnx_layer)               # the Linen layer's 'params'
load_linen_params(nnx_layer, variables['params'])  # a Linen tree into the NNX layer
"""

from typing import Any, Mapping

from flax import nnx


def to_linen_params(module: nnx.Module) -> dict:
  """The NNX layer's (or model's) parameters as the Linen layer's `params` tree.

  Shared parameters passed in with `shared_params` belong to the model, not the
  layer, and are left out (the Linen layer takes them as an argument too).
  """
  tree = nnx.to_pure_dict(nnx.state(module, nnx.Param))
  return _drop_shared(tree)


def _drop_shared(tree):
  if not isinstance(tree, dict):
    return tree
  return {k: _drop_shared(v) for k, v in tree.items() if k != 'shared_params'}


def load_linen_params(module: nnx.Module, params: Mapping[str, Any]) -> None:
  """Loads a Linen `params` tree (e.g. `variables['params']` of the Linen layer, or
  of a Linen checkpoint) into the NNX layer or model in place.

  Raises ValueError naming the first path whose name or shape differs.
  """
  state = nnx.state(module, nnx.Param)
  ours = _drop_shared(nnx.to_pure_dict(state))
  _check_same_tree(ours, dict(params), ())
  nnx.replace_by_pure_dict(state, dict(params))
  nnx.update(module, state)


def _check_same_tree(ours, theirs, path):
  where = '/'.join(path) or '(root)'
  if isinstance(ours, dict) != isinstance(theirs, dict):
    raise ValueError(f'parameter {where}: one tree has a subtree where the other has an array')
  if isinstance(ours, dict):
    if set(ours) != set(theirs):
      raise ValueError(
        f'parameters under {where} differ: the NNX module has '
        f'{sorted(ours)}, the Linen tree has {sorted(theirs)}'
      )
    for key in ours:
      _check_same_tree(ours[key], theirs[key], path + (str(key),))
  elif tuple(ours.shape) != tuple(theirs.shape):
    raise ValueError(
      f'parameter {where}: shape {tuple(theirs.shape)} in the Linen tree, '
      f'{tuple(ours.shape)} in the NNX module'
    )

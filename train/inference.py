"""A trained run's model and parameters, for inference and analysis.

    config, model, params = inference.load(workdir)
    logits = model.apply({'params': params}, inputs, train=False)

Reads the run's stored config (`config.json`) and its newest sound checkpoint;
the data is not read. The benchmarks and analysis tools load runs this way.
"""

from typing import Any, Tuple

from train import checkpoint
from train import modeling
from train import sharding
from train import steps
from train import validate
from train import workdir as workdir_lib


def load(workdir: str, mesh=None) -> Tuple[Any, Any, Any]:
  """(config, model, params) of the newest sound checkpoint of `workdir`.

  Params are replicated over `mesh` (default: all devices); LoRA adapters stay
  separate (see `train.adapters.unwrap` to merge them). The model does not split the
  sequence, whatever mesh the run trained on: it runs outside any mesh.
  """
  stored = workdir_lib.load_config(workdir)
  if stored is None:
    raise FileNotFoundError(f'{workdir} has no {workdir_lib.CONFIG}: not a run directory')
  config = validate.resolved(stored, read_data=False)
  mesh = sharding.create_mesh() if mesh is None else mesh
  model = modeling.create_model(config, split_sequence=False)
  _, params = checkpoint.restore_params(workdir, mesh, steps.abstract_params(model, config, mesh))
  return config, model, params

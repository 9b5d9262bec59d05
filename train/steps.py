"""The jit-compiled pieces of training: state creation, train step, eval step.

    state = steps.create_train_state(model, tx, inputs, mesh, key)  # inputs: example inputs
    train_step = steps.make_train_step(task, model, tx, base_key, mesh)
    state, metrics = train_step(state, global_batch)     # metric sums of the step
    eval_step = steps.make_eval_step(task, model, mesh)
    sums = eval_step(state.params, global_batch)

The mesh (`train/mesh.py`) places everything: the batch's rows over data x fsdp
(and its tokens over 'sequence'), the state by the FSDP rule (leaves of at least
`fsdp_min_size` elements split over 'fsdp', the rest replicated; on a mesh without
an 'fsdp' axis, or of fsdp size 1, all replicated); XLA inserts the gathers and the
gradient reductions. The steps run inside `jax.set_mesh(mesh)`, where the library's
sequence-parallel layers find it. The step's randomness is `fold_in(base_key, step)`,
split into the 'dropout' and 'features' rngs, so it depends only on (seed, step),
never on the device count, the mesh or a resume.
"""

import functools
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from train import mesh as mesh_lib
from train import modeling

MIN_SIZE = mesh_lib.FSDP_MIN_SIZE

# XLA:CPU hands reductions to YNNPACK, which splits a sum over the threads it has, so the
# same run added in another order on 1 and on 2 cores (the quick start: 96.39% and 95.28%).
# XLA's own reduction emitter adds in an order of the shapes alone; dots stay in YNNPACK
# (theirs does not depend on the threads). About 7% of a default-config step's CPU time.
CPU_COMPILER_OPTIONS = {
  'xla_cpu_experimental_ynn_fusion_type': 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT'
}


@functools.lru_cache(maxsize=None)
def _cpu_options_known() -> bool:
  """Whether this XLA takes `CPU_COMPILER_OPTIONS` (a later one may rename the option)."""
  try:
    jax.jit(lambda x: x.sum(), compiler_options=CPU_COMPILER_OPTIONS).lower(
      jax.ShapeDtypeStruct((2,), jnp.float32)
    ).compile()
  except Exception:  # pylint: disable=broad-except
    return False
  return True


def compiler_options(mesh):
  """`CPU_COMPILER_OPTIONS` for a mesh of CPUs (where this XLA knows them), else None."""
  if mesh.devices.flat[0].platform != 'cpu' or not _cpu_options_known():
    return None
  return CPU_COMPILER_OPTIONS


@flax.struct.dataclass
class TrainState:
  """step (int32 scalar: updates done), params and optimiser state."""

  step: jnp.ndarray
  params: Any
  opt_state: Any


def init_params(model, inputs, key):
  """Fresh parameters of `model` (float32), initialised on `inputs`: example inputs
  `[1, ...]` (`modeling.dummy_inputs`), or the config whose dummy inputs they are."""
  if isinstance(inputs, ml_collections.ConfigDict):
    inputs = modeling.dummy_inputs(inputs)
  variables = model.init({'params': key}, inputs, train=False)
  return variables['params']


def abstract_params(model, inputs, mesh, fsdp_min_size: int = MIN_SIZE):
  """The params as ShapeDtypeStructs with their shardings on `mesh` (the FSDP rule; no
  compute); `inputs` as for `init_params`."""
  with jax.set_mesh(mesh):
    shapes = jax.eval_shape(lambda: init_params(model, inputs, jax.random.key(0)))
  return mesh_lib.with_shardings(shapes, mesh, fsdp_min_size)


def abstract_state(model, tx, inputs, mesh, fsdp_min_size: int = MIN_SIZE) -> TrainState:
  """The TrainState as ShapeDtypeStructs with their shardings on `mesh` (no compute)."""

  def build():
    params = init_params(model, inputs, jax.random.key(0))
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))

  with jax.set_mesh(mesh):
    shapes = jax.eval_shape(build)
  return mesh_lib.with_shardings(shapes, mesh, fsdp_min_size)


def create_train_state(
  model, tx, inputs, mesh, key, params=None, fsdp_min_size: int = MIN_SIZE
) -> TrainState:
  """A TrainState at step 0 placed on `mesh` (the FSDP rule), params from `key` (on
  `inputs`, as for `init_params`) unless `params` are given."""
  shardings = jax.tree.map(
    lambda leaf: leaf.sharding, abstract_state(model, tx, inputs, mesh, fsdp_min_size)
  )

  def from_params(params):
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))

  with jax.set_mesh(mesh):
    if params is None:
      return jax.jit(lambda k: from_params(init_params(model, inputs, k)), out_shardings=shardings)(
        key
      )
    return jax.jit(from_params, out_shardings=shardings)(jax.device_put(params, shardings.params))


class MeshStep:
  """A step jit-compiled with the shardings of its arguments' shapes, run in the mesh.

  `shardings(*args)` gives (in_shardings, out_shardings) from the arguments (arrays or
  ShapeDtypeStructs); one compilation per tree and shapes. Calling it, or `lower`
  (`.lower(*args).compile()`, for XLA's analyses), enters `jax.set_mesh(mesh)`.
  """

  def __init__(self, fn, mesh, shardings, **jit_kwargs):
    self.fn, self.mesh, self._shardings, self._jit_kwargs = fn, mesh, shardings, jit_kwargs
    self._compiled = {}

  def jitted(self, *args):
    """The `jax.jit` of `fn` for arguments of these shapes."""
    leaves, treedef = jax.tree.flatten(args)
    key = (treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves))
    if key not in self._compiled:
      in_shardings, out_shardings = self._shardings(*args)
      self._compiled[key] = jax.jit(
        self.fn,
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        compiler_options=compiler_options(self.mesh),
        **self._jit_kwargs,
      )
    return self._compiled[key]

  def __call__(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted(*args)(*args)

  def lower(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted(*args).lower(*args)


def make_train_step(
  task, model, tx: optax.GradientTransformation, base_key, mesh, fsdp_min_size: int = MIN_SIZE
) -> Callable[[TrainState, Any], Any]:
  """jit(train_step)(state, batch) -> (state, metrics), a `MeshStep` on `mesh`.

  metrics: the task's metric sums over the global batch, plus 'grad_norm'
  multiplied by 'count' (so that, like the others, sum / count averages it).
  The state argument is donated; it keeps its shardings (the FSDP rule).
  """
  replicated = mesh_lib.replicated(mesh)

  def shardings(state, batch):
    placed = mesh_lib.state_shardings(mesh, state, fsdp_min_size)
    return (placed, mesh_lib.batch_shardings(mesh, batch)), (placed, replicated)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(base_key, state.step)
    dropout_rng, features_rng = jax.random.split(rng)
    rngs = {'dropout': dropout_rng, 'features': features_rng}

    def loss_fn(params):
      return task.loss_and_metrics(model, params, batch, train=True, rngs=rngs)

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads) * metrics['count'])
    return TrainState(state.step + 1, params, opt_state), metrics

  return MeshStep(train_step, mesh, shardings, donate_argnums=0)


def make_eval_step(task, model, mesh, fsdp_min_size: int = MIN_SIZE) -> Callable[[Any, Any], Any]:
  """jit(eval_step)(params, batch) -> the task's metric sums over the global batch (a
  `MeshStep` on `mesh`)."""
  replicated = mesh_lib.replicated(mesh)

  def shardings(params, batch):
    return (
      (
        mesh_lib.state_shardings(mesh, params, fsdp_min_size),
        mesh_lib.batch_shardings(mesh, batch),
      ),
      replicated,
    )

  def eval_step(params, batch):
    return task.loss_and_metrics(model, params, batch, train=False, rngs=None)[1]

  return MeshStep(eval_step, mesh, shardings)

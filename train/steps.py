"""The jit-compiled pieces of training: state creation, train step, eval step.

    state = steps.create_train_state(model, tx, inputs, mesh, key)  # inputs: example inputs
    train_step = steps.make_train_step(task, model, tx, base_key, mesh)
    state, metrics = train_step(state, global_batch)     # metric sums of the step
    eval_step = steps.make_eval_step(task, model, mesh)
    sums = eval_step(state.params, global_batch)

Data parallelism: the state is replicated over the mesh and the batch split
along 'data'; XLA inserts the gradient all-reduce. The step's randomness is
`fold_in(base_key, step)`, split into the 'dropout' and 'features' rngs, so it
depends only on (seed, step), never on the device count or a resume.
"""
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from train import models
from train import sharding


@flax.struct.dataclass
class TrainState:
  """step (int32 scalar: updates done), params and optimiser state."""
  step: jnp.ndarray
  params: Any
  opt_state: Any


def init_params(model, inputs, key):
  """Fresh parameters of `model` (float32), initialised on `inputs`: example inputs
  `[1, ...]` (`models.dummy_inputs`), or the config whose dummy inputs they are."""
  if isinstance(inputs, ml_collections.ConfigDict):
    inputs = models.dummy_inputs(inputs)
  variables = model.init({'params': key}, inputs, train=False)
  return variables['params']


def _with_sharding(shapes, mesh):
  repl = sharding.replicated(mesh)
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=repl), shapes)


def abstract_params(model, inputs, mesh):
  """The params as ShapeDtypeStructs with replicated shardings (no compute); `inputs` as
  for `init_params`."""
  return _with_sharding(jax.eval_shape(
      lambda: init_params(model, inputs, jax.random.key(0))), mesh)


def abstract_state(model, tx, inputs, mesh) -> TrainState:
  """The TrainState as ShapeDtypeStructs with replicated shardings (no compute)."""
  def build():
    params = init_params(model, inputs, jax.random.key(0))
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  return _with_sharding(jax.eval_shape(build), mesh)


def create_train_state(model, tx, inputs, mesh, key, params=None) -> TrainState:
  """A replicated TrainState at step 0, params from `key` (on `inputs`, as for
  `init_params`) unless `params` are given."""
  repl = sharding.replicated(mesh)

  def from_params(p):
    return TrainState(jnp.zeros((), jnp.int32), p, tx.init(p))
  if params is None:
    return jax.jit(lambda k: from_params(init_params(model, inputs, k)),
                   out_shardings=repl)(key)
  return jax.jit(from_params, out_shardings=repl)(jax.device_put(params, repl))


def make_train_step(task, model, tx: optax.GradientTransformation, base_key, mesh
                    ) -> Callable[[TrainState, Any], Any]:
  """jit(train_step)(state, batch) -> (state, metrics).

  metrics: the task's metric sums over the global batch, plus 'grad_norm'
  multiplied by 'count' (so that, like the others, sum / count averages it).
  The state argument is donated.
  """
  repl, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)

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

  return jax.jit(train_step, in_shardings=(repl, data), out_shardings=(repl, repl),
                 donate_argnums=0)


def make_eval_step(task, model, mesh) -> Callable[[Any, Any], Any]:
  """jit(eval_step)(params, batch) -> the task's metric sums over the global batch."""
  repl, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)

  def eval_step(params, batch):
    return task.loss_and_metrics(model, params, batch, train=False, rngs=None)[1]

  return jax.jit(eval_step, in_shardings=(repl, data), out_shardings=repl)

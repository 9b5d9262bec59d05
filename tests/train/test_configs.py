"""Every shipped config loads, validates, builds its model and takes a train step."""

import glob
import os

from absl import flags
import helpers
import jax
import ml_collections
from ml_collections import config_flags
import numpy as np
import pytest

import data
from efficient_attn import registry
from train import modeling
from train import optim
from train import sharding
from train import steps
from train import tasks
from train import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_FILES = sorted(
  os.path.relpath(p, ROOT)
  for p in glob.glob(os.path.join(ROOT, 'configs', '**', '*.py'), recursive=True)
  if os.path.basename(p) not in ('__init__.py', 'common.py', 'fields.py', 'presets.py')
)


# Smoke tests compile with little optimisation: about 30% less CPU time.
load = helpers.load_config


def runnable(config, image_folder_root, generated_root=None):
  """Points an ImageFolder config at the test folder, a generated task at a few
  examples in `generated_root` (the byte LM at a 5-document corpus) and LRA Retrieval at a
  few written pairs there; drops init_from (no earlier run here)."""
  if config.dataset.name == 'image_folder':
    config.dataset.data_dir = str(image_folder_root)
  if config.dataset.get('source') == 'tsv' and generated_root is not None:
    from conftest import write_aan_folder  # pylint: disable=g-import-not-at-top

    config.dataset.data_dir = write_aan_folder(os.path.join(str(generated_root), 'aan'))
  if config.dataset.get('source') == 'generated' and generated_root is not None:
    config.dataset.data_dir = os.path.join(str(generated_root), config.dataset.name)
    config.dataset.sizes = ml_collections.ConfigDict({'train': 4, 'validation': 2, 'test': 2})
  if config.dataset.name == 'text_bytes' and generated_root is not None:  # a 5-review corpus
    corpus = os.path.join(str(generated_root), 'text_bytes_corpus')
    os.makedirs(corpus, exist_ok=True)
    for i in range(5):
      with open(os.path.join(corpus, f'{i}.txt'), 'w') as f:
        f.write(f'Review {i}: a quiet film. ' * 20)
    config.dataset.update(dict(corpus=corpus, validation_docs=1))
  config.init_from = ''
  return config


@pytest.fixture(scope='module')
def generated_root(tmp_path_factory):
  return tmp_path_factory.mktemp('generated')


def test_required_configs_exist():
  names = {os.path.basename(p)[:-3] for p in CONFIG_FILES}
  required = {
    'default',
    'cifar10',
    'cifar10_nystrom',
    'cifar100',
    'mnist',
    'imdb',
    'imagenet',
    'image_folder',
    'digits_pixels',
    'mnist_pixels',
  }
  assert required <= names, required - names


@pytest.mark.parametrize('mechanism', registry.list_mechanisms())
def test_every_mechanism_has_a_cifar10_and_an_imdb_config(mechanism):
  """configs/cifar10.py:<m>, configs/imdb.py:<m> and configs/lra/<task>.py:<m> exist for
  every registered mechanism."""
  lra = [
    (f'configs/lra/{task}.py', f'{mechanism},size={size}')
    for task in ('listops', 'pathfinder', 'image', 'text')
    for size in ('base', 'small')
  ]
  lra += [
    ('configs/lra/retrieval.py', f'{mechanism},size={size},data_dir=lra/tsv_data')
    for size in ('base', 'small')
  ]
  for path, arg in [
    ('configs/cifar10.py', mechanism),
    ('configs/imdb.py', mechanism),
    ('configs/cifar10.py', f'{mechanism},size=small'),
  ] + lra:
    config = load(path, arg)
    assert config.attention.mechanism == mechanism
    validate.validate_config(config)


@pytest.mark.parametrize('path', CONFIG_FILES)
def test_config_validates(path, image_folder_root, generated_root):
  config = runnable(load(path), image_folder_root, generated_root)
  validate.validate_config(config)
  for field in ('dataset', 'model', 'attention', 'optim', 'train', 'lora', 'task', 'init_from'):
    assert field in config, field


def parse_flags(*args):
  """The config main.py would see for `python main.py *args`."""
  argv = ['main.py', *args]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=fv, sys_argv=argv)
  fv(argv)
  return fv.config


def test_command_line_overrides_and_args():
  config = parse_flags(
    f'--config={ROOT}/configs/mnist.py:super',
    '--config.model.num_heads=8',
    '--config.attention.mechanism=linear',
  )
  assert config.attention.projection == 'super'
  assert config.model.num_heads == 8 and config.attention.mechanism == 'linear'
  config = parse_flags(
    f'--config={ROOT}/configs/cifar10.py:mechanism=nystrom,projection=efficient',
    '--config.attention.options.num_landmarks=16',
  )
  assert config.attention.options.num_landmarks == 16
  assert config.attention.projection == 'efficient'
  assert load('configs/imdb.py', 'linear,max_length=4096').dataset.max_length == 4096


@pytest.mark.parametrize(
  'arg,message',
  [
    ('lra/listops.py:size=tiny', "size='tiny' is not valid; valid choices: base, small"),
    (
      'lra/listops.py:linear,sise=small',
      "unknown key 'sise'; valid keys: mechanism, projection, size",
    ),
  ],
)
def test_a_config_argument_get_config_refuses_is_one_line(arg, message):
  """main.py reports a config file's own error in one line (ml_collections wraps it in the
  traceback of get_config), exiting before any work."""
  from train import cli  # pylint: disable=g-import-not-at-top

  argv = ['main.py', f'--config={ROOT}/configs/{arg}', '--workdir=unused']
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=fv, sys_argv=argv)
  flags.DEFINE_string('workdir', None, '', flag_values=fv)
  with pytest.raises(SystemExit) as e:
    cli.parse_flags(argv, fv)
  assert len(str(e.value).splitlines()) == 1 and 'Traceback' not in str(e.value), e.value
  assert str(e.value).startswith(f'Error: flag --config={ROOT}/configs/{arg}: '), e.value
  assert message in str(e.value)


@pytest.mark.parametrize('overrides', [(), ('--config.model.depth=3',)])
def test_a_config_file_that_does_not_exist_is_one_line(overrides):
  """`--config=configs/nope.py` (a typo): ml_collections defers the error to the config's
  first use, which printed two tracebacks after the workdir line (with an override: one)."""
  from train import cli  # pylint: disable=g-import-not-at-top

  argv = ['main.py', f'--config={ROOT}/configs/nope.py:x', *overrides]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=fv, sys_argv=argv)
  with pytest.raises(SystemExit) as e:
    cli.parse_flags(argv, fv)
  assert str(e.value) == (
    f'Error: flag --config={ROOT}/configs/nope.py:x: [Errno 2] No such '
    f"file or directory: '{ROOT}/configs/nope.py' (--helpfull lists the "
    'flags)'
  ), e.value


@pytest.mark.parametrize('mechanism', ['sparse', 'reformer'])
def test_a_pixel_model_that_cannot_sample_is_refused_before_training(mechanism):
  """configs/digits_pixels.py:sparse and :reformer have causal forms but no decoding form:
  they passed validation and failed in sampling after training. Refused up front, naming the
  mechanism and those that decode; without samples they train."""
  config = load('configs/digits_pixels.py', mechanism)
  valid = ', '.join(registry.names_where(lambda m: bool(m.decode)))
  with pytest.raises(
    validate.ConfigError,
    match=(
      f"^config.attention.mechanism='{mechanism}' has no decoding form, which the samples "
      rf'.*\(config.sample.num_samples=16, num_completions=8\); valid choices: {valid}; '
    ),
  ):
    validate.validate_config(config)
  config.sample.num_samples = config.sample.num_completions = 0
  validate.validate_config(config)


# Per attention layer, from the paper's tables 5 (MNIST) and 6 (CIFAR-100).
PAPER_COUNTS = {  # Hosseini & Hosseini (2024)
  'mnist': {'standard': 66_048, 'optimised': 49_536, 'efficient': 33_024, 'super': 37_184},
  'cifar100': {'standard': 263_168, 'optimised': 197_376, 'efficient': 131_584, 'super': 197_890},
}


@pytest.mark.parametrize(
  'experiment,projection', [(e, p) for e in PAPER_COUNTS for p in PAPER_COUNTS[e]]
)
def test_paper_parameter_counts(experiment, projection):
  config = load(f'configs/{experiment}.py', projection)
  model = modeling.create_model(config)
  shapes = jax.eval_shape(
    lambda: model.init(jax.random.key(0), modeling.dummy_inputs(config), train=False)
  )['params']
  _, per_layer = modeling.parameter_counts(shapes)
  assert per_layer == PAPER_COUNTS[experiment][projection]


def _distinct_configs():
  seen, out = set(), []
  for path in CONFIG_FILES:
    key = load(path).to_json_best_effort(sort_keys=True)
    if key not in seen:
      seen.add(key)
      out.append(path)
  return out


# Long documents through full softmax attention are running time, not compilation (LRA
# Retrieval: two documents of 4,000 bytes, 37 s a step on a loaded CPU): these configs train
# at a short length, and their full size is traced instead (jax.eval_shape of the init and of
# the train step on the full-length batch: every shape checked, nothing run).
SHORT = {
  'configs/lra/retrieval.py': dict(max_length=256),
  'configs/lra/listops.py': dict(min_length=64, max_length=256),
}


def _tiny(path, image_folder_root, generated_root, **dataset):
  """The config at depth 1, batch 2 (and `dataset` fields), validated, with its classes."""
  config = runnable(load(path), image_folder_root, generated_root)
  config.model.depth = 1
  config.dataset.batch_size = config.dataset.eval_batch_size = 2
  config.dataset.shuffle_buffer = 8
  config.dataset.update(dataset)
  validate.validate_config(config)
  config.dataset.num_classes = data.num_classes(config)
  return config


def _first_batch(config, mesh):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  with tfds.testing.mock_data(num_examples=4):
    return next(sharding.prefetch(data.get_train_data(config).batches(0), mesh))


def _full_size_traces(config, mesh):
  """The full-length pipeline's batch, and the init and train step traced on it."""
  batch = _first_batch(config, mesh)
  assert config.dataset.max_length in np.shape(jax.tree.leaves(batch)[0]), batch
  task, model = tasks.get_task(config.task), modeling.create_model(config)
  tx = optim.create_optimizer(config, num_steps=10)
  state = steps.abstract_state(model, tx, config, mesh)
  train_step = steps.make_train_step(task, model, tx, jax.random.key(1), mesh)
  with jax.set_mesh(mesh):
    new_state, metrics = jax.eval_shape(train_step.fn, state, batch)
  shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)
  assert shapes(new_state) == shapes(state)
  assert {k: v.shape for k, v in metrics.items()} == dict.fromkeys(metrics, ())


@pytest.mark.parametrize('path', _distinct_configs())
def test_train_steps_on_mock_data(path, image_folder_root, generated_root):
  """Each distinct config: its pipeline on mock data, its model, two train steps.

  Full width, input size, mechanism and projection; depth 1, batch 2 and
  the tests' XLA flags (conftest.py) keep the CPU time (mostly compilation)
  small. The learning rate is 0 at step 0 (warmup), so the parameters change
  at the second step. The long-document configs (SHORT) train at a short
  length, their full length traced.
  """
  mesh = sharding.create_mesh(jax.devices()[:1])
  if path in SHORT:
    _full_size_traces(_tiny(path, image_folder_root, generated_root), mesh)
  config = _tiny(path, image_folder_root, generated_root, **SHORT.get(path, {}))
  task = tasks.get_task(config.task)
  model = modeling.create_model(config)
  tx = optim.create_optimizer(config, num_steps=10)
  batch = _first_batch(config, mesh)
  init = jax.jit(lambda key: steps.init_params(model, config, key))
  key = jax.random.key(0)
  params = init(key)
  state = steps.create_train_state(model, tx, config, mesh, None, params)
  before = jax.device_get(state.params)
  train_step = steps.make_train_step(task, model, tx, jax.random.key(1), mesh)
  count = 2 * (modeling.sequence_length(config)[0] if config.task == 'pixel_lm' else 1)
  if config.task in ('sequence_labelling', 'byte_lm'):
    count = int((np.asarray(batch['label'])[..., 1] != -100).sum())
  for _ in range(2):
    state, metrics = train_step(state, batch)
    metrics = jax.device_get(metrics)
    assert metrics['count'] == count  # examples; pixel_lm: pixels; sequences: scored tokens
    assert np.isfinite(metrics['loss']) and metrics['grad_norm'] > 0
  assert int(state.step) == 2
  after = jax.device_get(state.params)
  changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), before, after))
  assert any(changed)

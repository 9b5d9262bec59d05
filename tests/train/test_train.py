"""End to end on the digits: the default config learns; bad configs fail early."""

import glob
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
import shared_runs

from configs import default as default_config
import data
from train import checkpoint
from train import inference
from train import timing
from train import trainer
from train import validate
from train import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope='module')
def default_run(run_once):
  """The shipped default config, unchanged: the quick start's run (see README.md)."""
  workdir = run_once('default', shared_runs.train_default)
  with open(os.path.join(workdir, 'results.json')) as f:
    return workdir, json.load(f)


PROGRESS = re.compile(
  r'step (\d+)/660 \| loss \d\.\d{3,} \| accuracy \d+\.\d\d% \| '
  r'top5_accuracy \d+\.\d\d% \| \d+ ex/s \| eta (\d+s|\d+m\d\ds)'
)


def test_default_run_prints_progress_and_the_final_line(default_run):
  """One line per log interval (step/total, loss, metrics, examples/s, ETA in seconds),
  an eval line per evaluation, and the final line with the rounded accuracy."""
  workdir, results = default_run
  with open(f'{workdir}.stdout') as f:
    lines = f.read().splitlines()
  steps = [int(m.group(1)) for m in map(PROGRESS.fullmatch, lines) if m]
  assert steps == [100, 200, 300, 400, 500, 600, 660], lines
  assert lines[-2].startswith('eval 660/660 | loss ')
  path = os.path.join(workdir, 'results.json')
  assert lines[-1] == (
    f'test accuracy {100 * results["eval_accuracy"]:.2f}% | loss '
    f'{results["eval_loss"]:#.4g} | top5_accuracy '
    f'{100 * results["eval_top5_accuracy"]:.2f}% | results in {path}'
  ), lines
  assert lines[0].startswith('vit: standard x softmax attention, 69,194 parameters')


def _shape(line):
  """A printed line with its numbers and paths masked (they differ from run to run)."""
  line = re.sub(r'results in \S+', 'results in PATH', re.sub(r'eta \S+', 'eta T', line))
  return re.sub(r'\d+', 'N', line)


def test_readme_quick_start_output_is_what_the_default_run_prints(default_run):
  """The README's quick-start output block has the lines the default run prints, in order
  (the numbers and the workdir aside)."""
  workdir, _ = default_run
  with open(os.path.join(ROOT, 'README.md')) as f:
    readme = f.read()
  block = re.search(r'It prints:\n\n```\n(.*?)```', readme, re.S).group(1).splitlines()
  with open(f'{workdir}.stdout') as f:
    printed = f.read().splitlines()
  assert block[0] == 'workdir runs/default'  # main.py's first line
  assert [_shape(line) for line in block[1:]] == [_shape(line) for line in printed]


RANGE = re.compile(r'test accuracy\s+between\s+(\d+(?:\.\d+)?)%\s+and\s+(\d+(?:\.\d+)?)%')


def test_the_quick_start_accuracy_is_in_the_readmes_range(default_run):
  """The quick start's test accuracy differs from CPU to CPU (issue 70, item 2: the README
  showed 93.89%; a 2-core AMD EPYC prints 95.28% on 2 threads and 96.39% on 1): the README
  states the range, and both this run's and its own output block's figures fall in it."""
  workdir, _ = default_run
  with open(os.path.join(ROOT, 'README.md')) as f:
    quick_start = f.read().split('## Quick start', 1)[1].split('\n## ', 1)[0]
  stated = RANGE.search(quick_start)
  assert stated, "README's quick start states no 'test accuracy between L% and H%'"
  low, high = map(float, stated.groups())
  assert 0 < high - low <= 4, (low, high)  # a range that says something
  with open(f'{workdir}.stdout') as f:
    printed = float(re.match(r'test accuracy (\d+\.\d\d)%', f.read().splitlines()[-1])[1])
  shown = float(re.search(r'^test accuracy (\d+\.\d\d)%', quick_start, re.M)[1])
  assert low <= printed <= high and low <= shown <= high, (low, printed, shown, high)


def test_default_config_learns(default_run):
  _, results = default_run
  assert results['eval_accuracy'] >= 0.8, results  # chance is 0.1
  assert results['train_accuracy'] >= 0.8, results


def test_clock_steady_rate_leaves_out_the_first_step_and_pauses(monkeypatch):
  """A run shorter than an epoch still gets a measured rate: the steps after the first
  (compiling) one, eval and checkpoint time excluded."""
  now = [0.0]
  monkeypatch.setattr(timing.time, 'monotonic', lambda: now[0])
  clock = timing.Clock(steps_per_epoch=100)
  assert clock.steady_steps_per_sec() is None
  now[0] = 30.0  # the first step compiles
  clock.tick(1)
  for step in range(2, 12):
    with clock.paused():  # eval / checkpoint of the step before
      now[0] += 10.0
    now[0] += 0.5
    clock.tick(step)
  with clock.paused():  # the final evaluation, after the last step
    now[0] += 60.0
  assert clock.steady_steps_per_sec() == pytest.approx(2.0)  # 10 steps in 5 s
  assert clock.epoch_time() is None  # no whole epoch


def test_workdir_layout(default_run):
  workdir, results = default_run
  config = workdir_lib.load_config(workdir)
  assert config.attention.mechanism == 'softmax' and config.model.d_model == 64
  for key in (
    'train_loss',
    'train_accuracy',
    'eval_loss',
    'eval_accuracy',
    'eval_top5_accuracy',
    'params_total',
    'params_per_attention_layer',
    'examples_per_sec',
    'epoch_time_s',
    'steps',
    'wall_time_s',
    'dataset',
    'mechanism',
    'projection',
    'heads',
    'd_model',
  ):
    assert key in results, key
  assert results['params_per_attention_layer'] == 4 * (64 * 64 + 64)  # standard, d_m = 64
  assert results['steps'] == 30 * (1437 // 64)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  train_rows = [r for r in rows if r['split'] == 'train']
  eval_rows = [r for r in rows if r['split'] == 'eval']
  assert train_rows and eval_rows and train_rows[-1]['step'] == results['steps']
  for key in ('step', 'loss', 'accuracy', 'top5_accuracy', 'grad_norm', 'learning_rate'):
    assert key in train_rows[-1], key
  progress = [r for r in rows if r['split'] == 'progress']  # train.progress, and the
  assert progress and all(  # printed 'ex/s' (the last equals results.json's)
    {'steps_per_sec', 'uptime', 'steady_examples_per_sec'} & set(r) for r in progress
  )
  printed = [r['steady_examples_per_sec'] for r in progress if 'steady_examples_per_sec' in r]
  assert printed[-1] == pytest.approx(results['steady_examples_per_sec'])
  assert results['epochs_timed'] == 30 and results['epoch_time_s'] > 0
  # the steady rate (every step after the first) agrees with the measured epochs
  assert 0.5 < results['steady_examples_per_sec'] / results['examples_per_sec'] < 2
  assert eval_rows[-1]['accuracy'] == pytest.approx(results['eval_accuracy'])
  events = glob.glob(os.path.join(workdir, 'tensorboard', 'events.out.tfevents.*'))
  assert events
  from tensorflow.compat.v1 import train as tf_train  # TensorFlow's reader checks the records

  scalars = {
    (v.tag, e.step): v.simple_value
    for path in events
    for e in tf_train.summary_iterator(path)
    for v in e.summary.value
  }
  assert scalars[('eval/accuracy', results['steps'])] == pytest.approx(results['eval_accuracy'])
  steps = checkpoint.Checkpointer(workdir, create=False).steps()
  assert steps[-1] == results['steps'] and len(steps) <= config.train.keep_checkpoints


def test_rerun_of_a_finished_run_does_nothing(default_run):
  workdir, results = default_run
  assert trainer.train_and_evaluate(default_config.get_config(), workdir) == results


def test_evaluate_and_load_model_and_params(default_run):
  workdir, results = default_run
  values = trainer.evaluate(default_config.get_config(), workdir)
  assert values['accuracy'] == pytest.approx(results['eval_accuracy'])
  config, model, params = inference.load(workdir)
  batch = data.get_eval_batch(config)
  logits = model.apply({'params': params}, batch['inputs'], train=False)
  correct = (np.argmax(logits, -1) == batch['label']) * batch['mask']
  assert correct.sum() / batch['mask'].sum() == pytest.approx(results['eval_accuracy'])


BAD_CONFIGS = [
  # (override, expected fragments of the message)
  ({'attention.mechanism': 'nystrm'}, ["attention.mechanism='nystrm'", 'nystrom', 'linear']),
  ({'attention.projection': 'supper'}, ["attention.projection='supper'", 'super']),
  ({'dataset.name': 'mnistt'}, ["dataset.name='mnistt'", 'mnist', 'cifar10', 'digits']),
  ({'model.kind': 'cnn'}, ["model.kind='cnn'", 'vit']),
  ({'model.kind': 'text'}, ["model.kind='text'", 'vit']),
  ({'task': 'regression'}, ["task='regression'", 'classification']),
  ({'model.num_heads': 3}, ['model.num_heads=3', 'd_model=64', '4']),
  ({'model.patch_size': 3}, ['model.patch_size=3', 'image_size=8', '4']),
  ({'train.dtype': 'float16'}, ["train.dtype='float16'", 'bfloat16']),
  ({'train.num_epochs': -1}, ['num_steps=-1', 'num_epochs=-1', 'set one of them > 0']),
  ({'optim.name': 'lion'}, ["optim.name='lion'", 'adamw', 'sgd']),
  ({'dataset.augment': 'mixup'}, ["dataset.augment='mixup'", 'crop_flip']),
  ({'attention.options': {'num_landmarks': 4}}, ['num_landmarks', "'softmax'"]),
  (
    {'dataset.name': 'image_folder', 'dataset.num_classes': 0},
    ["dataset.data_dir=''", 'image_folder'],
  ),
]


@pytest.mark.parametrize('overrides,fragments', BAD_CONFIGS)
def test_bad_config_names_field_value_and_choices(overrides, fragments):
  config = default_config.get_config()
  for field, value in overrides.items():
    group, _, name = field.rpartition('.')
    target = config[group] if group else config
    target[name] = value
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(config)
  for fragment in fragments:
    assert fragment in str(e.value), (fragment, str(e.value))


def test_sequence_longer_than_fixed_length_mechanism():
  from configs import imdb  # pylint: disable=g-import-not-at-top

  config = imdb.get_config('linformer,max_length=512')
  config.model.max_length = 256  # the model's E, F are built for 256 tokens
  with pytest.raises(
    validate.ConfigError,
    match=r'sequence length 512.*fixed context length '
    r"256.*'linformer'",
  ):
    validate.validate_config(config)


@pytest.mark.slow
def test_main_rejects_bad_config_before_any_work(tmp_path):
  workdir = tmp_path / 'run'
  proc = subprocess.run(
    [
      sys.executable,
      'main.py',
      '--config=configs/default.py',
      f'--workdir={workdir}',
      '--config.attention.mechanism=nystrm',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode != 0
  assert "config.attention.mechanism='nystrm' is not valid; valid choices:" in proc.stderr
  assert not workdir.exists()


@pytest.mark.slow
def test_non_finite_loss_stops_without_nan_checkpoint(tmp_path):
  config = default_config.get_config()
  config.train.update(
    dict(
      num_epochs=-1,
      num_steps=40,
      checkpoint_every=1,
      keep_checkpoints=50,
      log_every=5,
      eval_every=-1,
    )
  )
  config.optim.update(dict(learning_rate=1e12, warmup_steps=0, grad_clip=0.0))
  workdir = str(tmp_path)
  with pytest.raises(FloatingPointError, match=r'at step \d+') as e:
    trainer.train_and_evaluate(config, workdir)
  bad_step = int(re.search(r'at step (\d+)', str(e.value)).group(1))
  ckpt = checkpoint.Checkpointer(workdir, create=False)
  saved = ckpt.steps()
  assert all(s <= bad_step for s in saved)
  for s in saved:
    params = ckpt.manager.restore(s)['params']
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params)), s
  ckpt.close()
  assert not os.path.exists(os.path.join(workdir, 'results.json'))


def test_a_failing_final_eval_loses_no_steps(tmp_path, monkeypatch):
  """The last checkpoint is written before the final evaluation, so an evaluation that
  fails costs nothing: the re-run resumes at the final step and only evaluates."""
  config = default_config.get_config()
  config.train.update(
    dict(num_epochs=-1, num_steps=6, checkpoint_every=100, log_every=3, eval_every=-1)
  )
  workdir = str(tmp_path)
  evaluate = trainer.Session.evaluate

  def broken(self, params, eval_data):
    raise RuntimeError('eval broke')

  monkeypatch.setattr(trainer.Session, 'evaluate', broken)
  with pytest.raises(RuntimeError, match='eval broke'):
    trainer.train_and_evaluate(config, workdir)
  ckpt = checkpoint.Checkpointer(workdir, create=False)
  assert ckpt.steps()[-1] == 6
  ckpt.close()
  monkeypatch.setattr(trainer.Session, 'evaluate', evaluate)
  results = trainer.train_and_evaluate(config, workdir)
  assert results['resumed_from_step'] == 6 and 'eval_accuracy' in results


def test_a_capped_warmup_is_not_a_warning(monkeypatch):
  """A short run caps optim.warmup_steps at optim.max_warmup_fraction by design (lra/listops
  :small does every time): absl INFO, not a warning printed on every such run."""
  import types  # pylint: disable=g-import-not-at-top

  config = default_config.get_config()
  monkeypatch.setattr(trainer.modeling, 'parameter_counts', lambda params: (10, 2))
  warnings, infos = [], []
  monkeypatch.setattr(trainer.logging, 'warning', lambda *a: warnings.append(a))
  monkeypatch.setattr(trainer.logging, 'info', lambda *a: infos.append(a))
  trainer._log_start(
    types.SimpleNamespace(config=config),
    types.SimpleNamespace(params=None),
    num_steps=100,
    train_data=types.SimpleNamespace(steps_per_epoch=10),
    warmup=20,
  )  # pylint: disable=protected-access
  assert not warnings
  assert any('is capped at' in a[0] for a in infos)


def test_cpu_sums_do_not_depend_on_the_thread_count():
  """On CPU the steps compile with `steps.CPU_COMPILER_OPTIONS`, which keep reductions out of
  YNNPACK (whose sums split over the threads it has): no `__ynn_fusion` holds a reduction."""
  from train import steps  # pylint: disable=g-import-not-at-top

  mesh = jax.make_mesh((1,), ('data',))
  options = steps.compiler_options(mesh)
  assert options == steps.CPU_COMPILER_OPTIONS
  x = jax.ShapeDtypeStruct((64, 256), jax.numpy.float32)
  ours = jax.jit(lambda a: a.sum(0), compiler_options=options).lower(x).compile().as_text()
  assert '__ynn_fusion' not in ours

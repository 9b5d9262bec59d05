"""Never lose a run, never compute the wrong thing quietly: workdir identity, locks,
checkpoint integrity, save failures, metrics rows, early validation, flags.

Each test reproduces a way a run used to lose data or mix models.
"""

import json
import os
import subprocess
import sys

import main_runner
import numpy as np
import pytest

from configs import default as default_config
from efficient_attn import registry
from train import checkpoint
from train import metrics as metrics_lib
from train import trainer
from train import validate
from train import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny(**overrides):
  config = main_runner.config(num_steps=8, checkpoint_every=4)
  for path, value in overrides.items():
    group, _, name = path.rpartition('.')
    target = config
    for g in group.split('.'):
      target = target[g]
    target[name] = value
  return config


@pytest.fixture(scope='module')
def finished(run_once):
  """A finished 8-step run (checkpoints 4 and 8)."""
  return run_once('reliability_finished', lambda d: trainer.train_and_evaluate(tiny(), d))


@pytest.mark.parametrize(
  'overrides,field',
  [
    ({'model.d_model': 32}, 'model.d_model'),  # another shape
    ({'attention.mechanism': 'linear'}, 'attention.mechanism'),  # another model, same shapes
  ],
)
def test_another_config_is_refused_before_anything_is_written(finished, tmp_path, overrides, field):
  import shutil  # pylint: disable=g-import-not-at-top

  unfinished = str(tmp_path / 'run')
  shutil.copytree(finished, unfinished)
  os.remove(os.path.join(unfinished, 'results.json'))
  before = main_runner.snapshot(unfinished)
  for workdir in (unfinished, finished):  # resuming, and re-running a finished run
    snapshot = main_runner.snapshot(workdir)
    with pytest.raises(workdir_lib.WorkdirError) as e:
      trainer.train_and_evaluate(tiny(**overrides), workdir)
    assert field in str(e.value) and 'new --workdir' in str(e.value) and '--restart' in str(e.value)
    assert main_runner.snapshot(workdir) == snapshot  # no checkpoint deleted, config.json kept
  assert main_runner.snapshot(unfinished) == before


def test_eval_with_another_mechanism_is_refused(finished):
  with pytest.raises(
    workdir_lib.WorkdirError,
    match=r"cannot evaluate it \(attention."
    r"mechanism: 'softmax' -> 'linear'",
  ):
    trainer.evaluate(tiny(**{'attention.mechanism': 'linear'}), finished)
  values = trainer.evaluate(tiny(**{'train.num_steps': 99}), finished)  # may change
  assert 0 <= values['accuracy'] <= 1
  trainer.evaluate(tiny(**{'dataset.eval_split': 'train'}), finished)  # again: replaced
  with open(os.path.join(finished, 'eval_results.json')) as f:
    assert _strict_json(f.read())['split'] == 'train'
  assert not [f for f in os.listdir(finished) if '.tmp' in f]


def test_a_bad_config_against_an_existing_run_writes_nothing(finished):
  snapshot = main_runner.snapshot(finished)
  with pytest.raises(validate.ConfigError, match='batch_size=2000 exceeds'):
    trainer.train_and_evaluate(tiny(**{'dataset.batch_size': 2000}), finished)
  assert main_runner.snapshot(finished) == snapshot


def test_restart_moves_the_old_run_aside(finished, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(finished, workdir)
  workdir_lib.open_run(workdir, validate.resolved(tiny(**{'train.seed': 1})), restart=True).close()
  moved = [p for p in os.listdir(tmp_path) if p.startswith('run.replaced-')]
  assert len(moved) == 1 and os.path.exists(tmp_path / moved[0] / 'results.json')
  assert not os.path.exists(tmp_path / moved[0] / workdir_lib.LOCK)
  assert workdir_lib.load_config(workdir).train.seed == 1
  assert os.listdir(workdir) == ['config.json']  # and the lock is released


def test_restart_is_refused_while_another_trainer_holds_the_lock(tmp_path):
  """--restart used to move a live run aside while its trainer kept writing into
  both folders (config.json of one model beside results and checkpoints of the other)."""
  workdir = tmp_path / 'run'
  live = workdir_lib.open_run(str(workdir), validate.resolved(tiny()))  # a running trainer
  before = main_runner.snapshot(workdir)
  with pytest.raises(
    workdir_lib.WorkdirError,
    match=rf'^{workdir} is in use by another trainer \(pid {os.getpid()} on ',
  ):
    trainer.train_and_evaluate(tiny(**{'model.d_model': 32}), str(workdir), restart=True)
  assert (
    os.listdir(tmp_path) == ['run'] and main_runner.snapshot(workdir) == before
  )  # nothing moved
  live.close()
  assert not (workdir / workdir_lib.LOCK).exists()


def test_more_steps_continue_a_finished_run_fewer_are_refused(finished, tmp_path):
  """A finished run asked for more steps used to return its old results and store
  the new num_steps in config.json; a sweep listed it as done."""
  import shutil  # pylint: disable=g-import-not-at-top

  from train import sweep  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(finished, workdir)
  state = lambda steps: sweep.status(
    sweep.Run('run', 'configs/default.py', {}),
    str(tmp_path),
    validate.resolved(tiny(**{'train.num_steps': steps})),
  )
  assert [state(8), state(12), state(4)] == ['done', 'partial', 'changed']
  snapshot = main_runner.snapshot(workdir)
  with pytest.raises(
    workdir_lib.WorkdirError,
    match=r'results.json is from step 8; '
    r'train.num_steps=4.*may grow on resume, not shrink',
  ):
    trainer.train_and_evaluate(tiny(**{'train.num_steps': 4}), workdir)
  # a finished run again, with a field that may change: nothing to do, nothing rewritten
  assert trainer.train_and_evaluate(tiny(**{'train.log_every': 1}), workdir)['steps'] == 8
  assert main_runner.snapshot(workdir) == snapshot

  results = trainer.train_and_evaluate(tiny(**{'train.num_steps': 12}), workdir)
  assert results['steps'] == 12 and results['resumed_from_step'] == 8
  assert workdir_lib.load_config(workdir).train.num_steps == 12
  with open(os.path.join(workdir, 'results.json')) as f:
    assert json.load(f)['steps'] == 12
  with open(os.path.join(workdir, 'results.8-steps.json')) as f:
    assert json.load(f)['steps'] == 8  # the earlier results are kept
  assert workdir_lib.checkpoint_steps(workdir) == [4, 8, 12]
  assert state(12) == 'done'


def _strict_json(text):
  def reject(constant):
    raise ValueError(f'{constant} is not JSON')

  return json.loads(text, parse_constant=reject)


def test_json_files_are_strict_and_replaced_whole(tmp_path, monkeypatch):
  """results.json could hold a bare NaN; a second --mode=eval stopped with
  FileExistsError, leaving eval_results.json.tmp beside the old file."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  import fake_gcs  # pylint: disable=g-import-not-at-top

  with fake_gcs.installed(monkeypatch, tmp_path / 'bucket'):
    for folder in (str(tmp_path / 'local'), 'gs://bucket/run'):
      epath.Path(folder).mkdir(parents=True, exist_ok=True)
      workdir_lib.write_json(folder, 'eval_results.json', {'step': 4, 'loss': 1.0})
      workdir_lib.write_json(
        folder, 'eval_results.json', {'step': 8, 'loss': float('nan'), 'x': [float('-inf'), 2.0]}
      )
      text = (epath.Path(folder) / 'eval_results.json').read_text()
      assert _strict_json(text) == {'step': 8, 'loss': None, 'x': [None, 2.0]}
      assert [p.name for p in epath.Path(folder).iterdir()] == ['eval_results.json']


def test_a_second_trainer_is_kept_out_and_a_stale_lock_replaced(tmp_path):
  config = validate.resolved(tiny())
  run = workdir_lib.open_run(str(tmp_path), config)
  with pytest.raises(workdir_lib.WorkdirError, match=r'in use by another trainer \(pid'):
    workdir_lib.open_run(str(tmp_path), config)
  run.close()
  dead = subprocess.run(
    [sys.executable, '-c', 'import os; print(os.getpid())'],
    capture_output=True,
    text=True,
    check=True,
  )
  import socket  # pylint: disable=g-import-not-at-top

  (tmp_path / workdir_lib.LOCK).write_text(
    json.dumps({'pid': int(dead.stdout), 'host': socket.gethostname()})
  )
  workdir_lib.open_run(str(tmp_path), config).close()  # the process is gone: replaced


def _largest_params_file(step_dir):
  files = [os.path.join(b, f) for b, _, fs in os.walk(os.path.join(step_dir, 'params')) for f in fs]
  return max(files, key=os.path.getsize)


@pytest.mark.parametrize('damage', ['xor_every_5000_bytes', 'one_bit'])
def test_a_damaged_checkpoint_of_the_same_size_falls_back(finished, tmp_path, damage, caplog):
  import shutil  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(finished, workdir)
  path = _largest_params_file(os.path.join(workdir, 'checkpoints', '8'))
  data = bytearray(open(path, 'rb').read())
  size = len(data)
  if damage == 'one_bit':
    data[size // 2] ^= 0x01
  else:
    for i in range(0, size, 5000):
      data[i] ^= 0xFF
  open(path, 'wb').write(bytes(data))
  assert os.path.getsize(path) == size
  ckpt = checkpoint.Checkpointer(workdir, create=False)
  with caplog.at_level('WARNING'):
    step, params, _ = ckpt.restore()
  ckpt.close()
  assert step == 4
  assert 'checkpoint at step 8' in caplog.text and 'damaged' in caplog.text
  assert os.path.join('checkpoints', '8') in caplog.text
  assert all(np.all(np.isfinite(np.asarray(p))) for p in __import__('jax').tree.leaves(params))


@pytest.mark.slow
def test_an_unwritable_checkpoint_folder_stops_the_run_with_one_line(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  os.symlink('/proc/1/attr', workdir / 'checkpoints')  # a folder nobody can write into
  proc = subprocess.run(
    main_runner.command(str(workdir), num_steps=8, checkpoint_every=4),
    timeout=300,
    **main_runner.popen_kwargs(),
  )
  assert proc.returncode == 1
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('Error: saving the checkpoint at step 4 in') and 'checkpoints' in last
  assert 'Errno' in last and 'Traceback' not in proc.stderr


def test_metrics_rows_are_valid_json_and_not_repeated_after_a_resume(tmp_path):
  path = tmp_path / metrics_lib.JSONL
  writer = metrics_lib.JsonlWriter(path)
  for step in (10, 20, 30):
    writer.write_scalars(step, {'train/loss': 1.0 / step, 'eval/accuracy': float('nan')})
  writer.close()
  rows = [json.loads(line) for line in path.read_text().splitlines()]  # strict JSON
  assert rows[1] == {'step': 10, 'split': 'eval', 'accuracy': None}
  metrics_lib.JsonlWriter(path, resume_step=20).close()  # resumed from the step-20 checkpoint
  assert [r['step'] for r in metrics_lib.read_jsonl(path)] == [10, 10, 20, 20]


@pytest.mark.parametrize(
  'options,message',
  [
    ({'mechanism': 'nystrom', 'num_landmarks': 0}, "num_landmarks=0 of mechanism 'nystrom'"),
    ({'mechanism': 'local', 'window': 0}, "window=0 of mechanism 'local'"),
    ({'mechanism': 'linformer', 'k_proj': 0}, "k_proj=0 of mechanism 'linformer'"),
    ({'mechanism': 'linear', 'feature_map': 'softplus'}, "feature_map='softplus'"),
    ({'mechanism': 'softmax', 'window': 8}, "unknown option(s) ['window'] for mechanism 'softmax'"),
  ],
)
def test_mechanism_options_are_checked_before_any_work(options, message, tmp_path):
  config = default_config.get_config()
  options = dict(options)
  config.attention.mechanism = options.pop('mechanism')
  for name, value in options.items():
    config.attention.options[name] = value
  with pytest.raises(validate.ConfigError) as e:
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert message in str(e.value)
  assert not (tmp_path / 'run').exists()


def _main(*flags, tmp_path):
  return subprocess.run(
    [sys.executable, 'main.py', f'--workdir={tmp_path / "run"}', *flags],
    cwd=ROOT,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
    capture_output=True,
    text=True,
    timeout=120,
  )


@pytest.mark.parametrize(
  'flags,message',
  [
    (
      ['--config.model.num_head=4'],
      "Invalid config override --config.model.num_head: no field 'num_head'; did you mean "
      '"num_heads"',
    ),
    (['--config.attention.options.num_landmarks=abc'], 'num_landmarks=abc'),
    (
      ['--num_processes=2', '--process_id=1'],
      'Error: --num_processes=2 --process_id=1 need --coordinator_address',
    ),
    (
      ['--num_processes=2', '--process_id=5', '--coordinator_address=localhost:1'],
      'Error: --process_id=5 is not valid for --num_processes=2; valid: 0..1',
    ),
  ],
)
@pytest.mark.slow
def test_bad_flags_fail_in_one_line_before_any_work(flags, message, tmp_path):
  proc = _main('--config=configs/default.py', *flags, tmp_path=tmp_path)
  assert proc.returncode != 0
  assert message in proc.stderr.strip().splitlines()[-1], proc.stderr[-1500:]
  assert 'Traceback' not in proc.stderr
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_a_missing_peer_times_out_with_a_message(tmp_path):
  proc = _main(
    '--config=configs/default.py',
    '--num_processes=2',
    '--process_id=0',
    f'--coordinator_address=localhost:{main_runner.free_port()}',
    '--distributed_timeout_s=5',
    tmp_path=tmp_path,
  )
  assert proc.returncode != 0
  assert 'could not join' in proc.stderr and 'within 5 s' in proc.stderr, proc.stderr[-2000:]


def test_any_config_takes_any_mechanisms_options_after_a_switch(tmp_path):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  argv = [
    'main.py',
    f'--config={ROOT}/configs/default.py',
    '--config.attention.mechanism=nystrom',
    '--config.attention.options.num_landmarks=4',
  ]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values, sys_argv=argv)
  values(argv)
  config = validate.resolved(values.config, read_data=False)
  assert config.attention.options.num_landmarks == 4
  assert config.attention.options.pinv_iterations == 6  # the declared default, recorded


def test_fields_added_later_keep_older_runs_resumable():
  """A config.json written before `model.positions` existed reads as its old behaviour
  ('learned'); a stored run that did differ is still refused."""
  config = tiny()
  stored = json.loads(config.to_json())
  del stored['model']['positions']
  assert workdir_lib.differences(stored, config.to_dict()) == []
  config.model.positions = 'sinusoidal'
  assert workdir_lib.differences(stored, config.to_dict()) == [
    "model.positions: 'learned' -> 'sinusoidal'"
  ]


def test_mamba2_layout_options_added_later_keep_older_runs_resumable():
  """A Mamba-2 run stored before `ngroups` and `d_state` existed is the layout their None
  defaults give; one that differs from a later run's setting is still refused."""
  stored = {'attention': {'mechanism': 'mamba2', 'options': {'chunk_size': 64}}}
  new = {
    'attention': {
      'mechanism': 'mamba2',
      'options': {'chunk_size': 64, 'ngroups': None, 'd_state': None},
    }
  }
  assert workdir_lib.differences(stored, new) == []
  new['attention']['options']['ngroups'] = 1
  assert workdir_lib.differences(stored, new) == ["attention.options.ngroups: None -> 1"]


def test_gated_options_added_later_rebuild_and_resume_older_runs(tmp_path):
  """A Gated DeltaNet or Mamba-2 run stored before `init`, `conv_bias`, `dt_min`, `dt_max`
  and `implementation` existed resumes under today's config of the same model, and its
  stored config rebuilds the model it trained: Mamba-2 without the convolution bias that is
  its default now (else its checkpoint would not fit); linear attention gets none of them."""
  for mechanism in ('mamba2', 'gated_deltanet'):
    options = dict(
      registry.get_mechanism(mechanism).resolve({'conv_bias': False, 'init': 'default'})
    )
    new = {'attention': {'mechanism': mechanism, 'options': dict(options)}}
    stored = {
      'attention': {
        'mechanism': mechanism,
        'options': {
          k: v
          for k, v in options.items()
          if k not in ('init', 'conv_bias', 'dt_min', 'dt_max', 'implementation')
        },
      }
    }
    assert workdir_lib.differences(stored, new) == [], mechanism
    (tmp_path / mechanism).mkdir()
    (tmp_path / mechanism / 'config.json').write_text(json.dumps(stored))
    loaded = workdir_lib.load_config(str(tmp_path / mechanism)).attention.options
    assert (loaded.conv_bias, loaded.init, loaded.dt_max) == (False, 'default', 0.1)
  # Gated DeltaNet's default start is fla's since 0.2.0: an older run resumed with today's
  # defaults is another model, refused naming the field (add init=default to resume it).
  new['attention']['options']['init'] = 'fla'
  assert workdir_lib.differences(stored, new) == ["attention.options.init: 'default' -> 'fla'"]
  (tmp_path / 'linear').mkdir()
  (tmp_path / 'linear' / 'config.json').write_text(
    json.dumps({'attention': {'mechanism': 'linear', 'options': {}}})
  )
  assert dict(workdir_lib.load_config(str(tmp_path / 'linear')).attention.options) == {}

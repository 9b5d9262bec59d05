"""Sweep expansion, naming, skipping and pod commands (no training here)."""

import glob
import json
import os
import signal
import sys

import jax
import pytest

from efficient_attn import registry
from train import sweep


def test_grid_expands_to_named_runs():
  runs = sweep.expand(
    dict(
      config='configs/mnist.py',
      grid={'attention.projection': ['standard', 'super'], 'model.num_heads': [1, 4]},
      fixed={'train.num_steps': 10},
    )
  )
  assert [r.name for r in runs] == [
    'projection=standard.num_heads=1',
    'projection=standard.num_heads=4',
    'projection=super.num_heads=1',
    'projection=super.num_heads=4',
  ]
  assert runs[3].overrides == {
    'train.num_steps': 10,
    'attention.projection': 'super',
    'model.num_heads': 4,
  }


def test_configs_in_grid_and_explicit_runs():
  runs = sweep.expand(
    dict(grid={'config': ['configs/mnist.py:super', 'configs/cifar10.py:linear']}, runs=[])
  )
  assert [r.name for r in runs] == ['mnist-super', 'cifar10-linear']
  runs = sweep.expand(
    dict(
      runs=[
        {'name': 'base', 'config': 'configs/lora_base.py:digits'},
        {'config': 'configs/lora_finetune.py:rotated,4,base={root}/base', 'name': 'ft'},
      ]
    ),
    root='/r',
  )
  assert [r.name for r in runs] == ['base', 'ft']
  assert runs[1].config == 'configs/lora_finetune.py:rotated,4,base=/r/base'
  runs = sweep.expand(
    dict(
      config='configs/default.py',
      runs=[
        {'attention.mechanism': 'linear'},
        {'attention.mechanism': 'local', 'attention.options.window': 8},
      ],
    )
  )
  assert [r.name for r in runs] == ['mechanism=linear', 'mechanism=local.window=8']


def test_bad_sweeps_fail_clearly(tmp_path):
  with pytest.raises(sweep.SweepError, match=r"unknown sweep keys \['gird'\]"):
    sweep.expand(dict(config='c.py', gird={}))
  with pytest.raises(sweep.SweepError, match="needs 'config'"):
    sweep.expand(dict(grid={'a': [1, 2]}))
  with pytest.raises(sweep.SweepError, match='nope.py.*does not exist'):
    sweep.load_sweep(str(tmp_path / 'nope.py'))
  (tmp_path / 'typo.py').write_text('def get_sweep():\n  return dict(confg=1)\n')
  with pytest.raises(sweep.SweepError, match=r"unknown sweep keys \['confg'\]"):
    sweep.expand(sweep.load_sweep(str(tmp_path / 'typo.py')))
  (tmp_path / 'broken.py').write_text('def get_sweep(:\n')
  with pytest.raises(sweep.SweepError, match='does not load: SyntaxError'):
    sweep.load_sweep(str(tmp_path / 'broken.py'))
  runs = sweep.expand(
    dict(
      config='configs/default.py',
      runs=[
        {'model.num_heads': 3},
        {'model.num_head': 4},
        {'attention.mechanism': 'nystrm'},
        {'model.depth': 1},
      ],
    )
  )
  with pytest.raises(sweep.SweepError) as e:  # every bad run named, up front
    sweep.check(runs)
  message = str(e.value)
  assert message.startswith('3 of 4 runs are not valid')
  assert 'num_heads=3' in message and 'num_head' in message and 'nystrm' in message


def test_runs_to_run_here_are_checked_on_this_machines_mesh():
  """`list` and `run` showed a run the mesh cannot hold as new (issue 70, item 13): a mesh
  axis the devices do not fit, a batch the mesh does not divide. With `here` each run is
  built as the trainer builds it on these devices; `pod` (other devices) skips that."""
  devices = jax.device_count()
  runs = sweep.expand(
    dict(
      config='configs/default.py',
      runs=[
        {'train.mesh': {'data': devices + 1}, 'name': 'too_many'},
        {'train.mesh': {'data': -1, 'sequence': devices + 1}, 'name': 'sequence'},
        {'dataset.batch_size': 63, 'train.mesh': {'data': 1}, 'name': 'fits'},
      ],
    )
  )
  assert set(sweep.check(runs)) == {'too_many', 'sequence', 'fits'}  # valid anywhere
  with pytest.raises(sweep.SweepError) as e:
    sweep.check(runs, here=True)
  lines = str(e.value).splitlines()
  assert lines[0] == '2 of 3 runs are not valid:', lines
  assert lines[1].startswith('  too_many: ') and f'needs {devices + 1} devices' in lines[1]
  assert lines[2].startswith('  sequence: ')


def test_bad_runs_print_main_pys_readable_messages_every_one():
  """Errors were escaped reprs ('\\'num_head\\'\\nDid you mean ...'), one per run: of two bad
  overrides one was hidden, and a config file's own error came with its exception type."""
  runs = sweep.expand(
    dict(
      config='configs/default.py',
      runs=[
        {'model.num_heads': 'x', 'train.num_step': 3},
        {'config': 'configs/lra/listops.py:size=tiny', 'model.depth': 1},
      ],
    )
  )
  with pytest.raises(sweep.SweepError) as e:
    sweep.check(runs)
  name = 'default.num_heads=x.num_step=3'
  assert str(e.value).splitlines() == [
    '2 of 2 runs are not valid:',
    f"  {name}: flag --config.model.num_heads=x: invalid literal for int() with base 10: 'x'",
    f"  {name}: Invalid config override --config.train.num_step: no field 'num_step'; did "
    'you mean "num_steps" instead of "num_step"?',
    "  listops-size=tiny.depth=1: flag --config=configs/lra/listops.py:size=tiny: "
    "configs/lra/listops.py: size='tiny' is not valid; valid choices: base, small",
  ]


def test_command_status_and_skip(tmp_path, capsys):
  runs = sweep.expand(dict(config='configs/default.py', grid={'train.seed': [0, 1]}))
  cmd = sweep.command(runs[0], str(tmp_path), python='python3')
  assert cmd == [
    'python3',
    'main.py',
    '--config=configs/default.py',
    f'--workdir={tmp_path}/seed=0',
    '--config.train.seed=0',
  ]
  assert sweep.status(runs[0], str(tmp_path)) == 'new'
  configs = sweep.check(runs)
  for run in runs:  # both finished with these configs: nothing is launched
    os.makedirs(tmp_path / run.name)
    (tmp_path / run.name / 'config.json').write_text(configs[run.name].to_json())
    (tmp_path / run.name / 'results.json').write_text(json.dumps({}))
  assert sweep.run_local(runs, str(tmp_path), configs, python='/nonexistent/python') == {
    'seed=0': 'skipped',
    'seed=1': 'skipped',
  }
  # The sweep's fixed values changed: its runs are not 'done', and are not touched.
  changed = sweep.expand(
    dict(config='configs/default.py', grid={'train.seed': [0, 1]}, fixed={'model.depth': 1})
  )
  new_configs = sweep.check(changed)
  assert sweep.status(changed[0], str(tmp_path), new_configs['seed=0']) == 'changed'
  assert (
    sweep.run_local(changed, str(tmp_path), new_configs, python='/nonexistent/python')['seed=0']
    == 'failed (changed config)'
  )
  os.remove(tmp_path / 'seed=1' / 'results.json')
  assert sweep.status(runs[1], str(tmp_path), configs['seed=1']) == 'partial'
  # A run that exits cleanly without results (stopped by SIGTERM) is resumable, not failed.
  assert sweep.run_local(runs, str(tmp_path), configs, python='true')['seed=1'] == sweep.STOPPED
  # A run whose process fails is reported, and the sweep goes on.
  out = sweep.run_local(runs, str(tmp_path), configs, python=sys.executable + '-missing')
  assert out['seed=1'].startswith('failed')


def test_pod_commands_start_every_worker():
  runs = sweep.expand(dict(config='configs/cifar10_nystrom.py', grid={'model.num_heads': [4, 8]}))
  cmds = sweep.pod_commands(runs, '/mnt/shared/sweep', 'v4-32', 'us-central2-b')
  assert len(cmds) == 2
  assert cmds[0].startswith(
    'gcloud compute tpus tpu-vm ssh v4-32 --zone=us-central2-b --worker=all'
  )
  assert '--workdir=/mnt/shared/sweep/num_heads=4' in cmds[0]


@pytest.mark.parametrize('path', sorted(glob.glob('sweeps/*.py') + glob.glob('studies/*/sweep.py')))
def test_shipped_sweeps_expand_to_existing_configs(path):
  runs = sweep.expand(sweep.load_sweep(path))
  assert runs
  for run in runs:
    assert os.path.exists(run.config.split(':')[0]), run.config


def test_the_cifar10_sweep_runs_exactly_what_its_config_files_run():
  """Each run of sweeps/cifar10_mechanisms.py is configs/cifar10.py:<mechanism>, options
  included."""
  from configs import cifar10  # pylint: disable=g-import-not-at-top
  from train import validate  # pylint: disable=g-import-not-at-top

  runs = sweep.expand(sweep.load_sweep('sweeps/cifar10_mechanisms.py'))
  configs = sweep.check(runs)
  assert {r.name for r in runs} == {f'cifar10-{m}' for m in registry.list_mechanisms()}
  for run in runs:
    mechanism = run.config.split(':')[1]
    direct = validate.resolved(cifar10.get_config(mechanism), read_data=False)
    assert configs[run.name].to_dict() == direct.to_dict(), run.name
    assert dict(direct.attention.options) == dict(registry.get_mechanism(mechanism).resolve())


def test_the_lra_sweep_takes_its_settings():
  """sweeps/lra.py: size picks the configs' size, tasks the tasks, aan_dir Retrieval's files."""
  names = {r.name for r in sweep.expand(sweep.load_sweep('sweeps/lra.py:size=small'))}
  assert names == {
    f'{t}-{m}' for t in ('listops', 'pathfinder') for m in registry.list_mechanisms()
  }
  runs = sweep.expand(
    sweep.load_sweep(
      'sweeps/lra.py:size=small,tasks=retrieval,'
      'mechanisms=linear,nystrom,aan_dir=gs://bucket/tsv_data'
    )
  )
  assert [r.config for r in runs] == [
    'configs/lra/retrieval.py:linear,size=small',
    'configs/lra/retrieval.py:nystrom,size=small',
  ]
  assert all(r.overrides['dataset.data_dir'] == 'gs://bucket/tsv_data' for r in runs)
  with pytest.raises(
    sweep.SweepError,
    match=r"unknown key 'SIZE'; valid keys: size, tasks, "
    r"mechanisms, aan_dir$",
  ):
    sweep.load_sweep('sweeps/lra.py:SIZE=small')


def test_ctrl_c_lets_the_running_run_save_and_starts_no_other(tmp_path, monkeypatch, capsys):
  """Ctrl-C while a run trains: the run gets SIGTERM (save and exit) and is waited for;
  it used to be killed 0.25 s later by subprocess.call, cutting its save short."""
  runs = sweep.expand(dict(config='configs/default.py', grid={'train.seed': [0, 1]}))
  configs = sweep.check(runs)
  started = []

  class Run:  # the first wait is interrupted by Ctrl-C; the run then exits cleanly
    def __init__(self, cmd):
      started.append(cmd)
      self.waits, self.signals = 0, []

    def wait(self):
      self.waits += 1
      if self.waits == 1:
        raise KeyboardInterrupt
      return 0

    def send_signal(self, sig):
      self.signals.append(sig)

    def kill(self):
      raise AssertionError('a run that is saving must not be killed')

  processes = []
  monkeypatch.setattr(
    sweep.subprocess, 'Popen', lambda cmd: processes.append(Run(cmd)) or processes[-1]
  )
  os.makedirs(tmp_path / 'seed=0')  # stopped with a checkpoint, no results: resumable
  (tmp_path / 'seed=0' / 'config.json').write_text(configs['seed=0'].to_json())
  out = sweep.run_local(runs, str(tmp_path), configs)
  assert out == {'seed=0': sweep.STOPPED, 'seed=1': sweep.NOT_STARTED}
  assert len(started) == 1 and processes[0].signals == [signal.SIGTERM]
  assert processes[0].waits == 2
  assert 'stop asked (Ctrl-C or SIGTERM): the run saves a checkpoint' in capsys.readouterr().out


def test_sigterm_to_the_sweep_lets_the_running_run_save_and_starts_no_other(tmp_path, monkeypatch):
  """A preemption signals the sweep too: it used to die at once (or, when only the run was
  signalled, start the next run); now the running run is asked to save and waited for, a
  repeated SIGTERM is ignored, and no other run starts."""
  runs = sweep.expand(dict(config='configs/default.py', grid={'train.seed': [0, 1]}))
  configs = sweep.check(runs)
  processes = []

  class Run:
    def __init__(self, cmd):
      self.waits, self.signals = 0, []
      processes.append(self)

    def wait(self):
      self.waits += 1
      if self.waits == 1:
        signal.raise_signal(signal.SIGTERM)  # the sweep's own SIGTERM, while its run trains
      elif self.waits == 2:
        signal.raise_signal(signal.SIGTERM)  # a second one must not cut the save short
      return 0

    def send_signal(self, sig):
      self.signals.append(sig)

    def kill(self):
      raise AssertionError('a run that is saving must not be killed')

  monkeypatch.setattr(sweep.subprocess, 'Popen', Run)
  os.makedirs(tmp_path / 'seed=0')
  (tmp_path / 'seed=0' / 'config.json').write_text(configs['seed=0'].to_json())

  def unhandled(signum, frame):  # not pytest's death, should the sweep not handle it
    raise AssertionError('SIGTERM reached the handler outside the sweep')

  before = signal.signal(signal.SIGTERM, unhandled)
  try:
    out = sweep.run_local(runs, str(tmp_path), configs)
    assert signal.getsignal(signal.SIGTERM) is unhandled
  finally:
    signal.signal(signal.SIGTERM, before)
  assert out == {'seed=0': sweep.STOPPED, 'seed=1': sweep.NOT_STARTED}
  assert len(processes) == 1 and processes[0].signals == [signal.SIGTERM]
  assert processes[0].waits == 2


def test_a_run_stopped_by_its_own_sigterm_stops_the_sweep(tmp_path):
  """Only the run was preempted (it saved and exited 0 without results): the sweep used
  to start the next run; it stops, and running it again resumes the stopped one."""
  runs = sweep.expand(dict(config='configs/default.py', grid={'train.seed': [0, 1, 2]}))
  configs = sweep.check(runs)
  for run in runs[:2]:  # seed=0 finished; seed=1 has a checkpoint and no results
    os.makedirs(tmp_path / run.name)
    (tmp_path / run.name / 'config.json').write_text(configs[run.name].to_json())
  (tmp_path / 'seed=0' / 'results.json').write_text(json.dumps({}))
  out = sweep.run_local(runs, str(tmp_path), configs, python='true')  # exits 0, saves nothing
  assert out == {'seed=0': 'skipped', 'seed=1': sweep.STOPPED, 'seed=2': sweep.NOT_STARTED}


def test_a_run_whose_classes_are_read_from_the_data_resumes_and_is_done(tmp_path):
  """MQAR's num_classes is 0 in the sweep's config (read from the data when the run starts)
  and the vocabulary in the config.json the run stored: the same run, not another config."""
  runs = sweep.expand(
    dict(
      runs=[
        dict(
          config='configs/mqar.py:linear,d_model=16,seq_len=32,'
          'num_kv_pairs=2,vocab_size=64,num_steps=4',
          name='mqar',
        )
      ]
    )
  )
  configs = sweep.check(runs)
  assert configs['mqar'].dataset.num_classes == 0
  stored = configs['mqar'].copy_and_resolve_references()
  stored.dataset.num_classes = 64
  os.makedirs(tmp_path / 'mqar')
  (tmp_path / 'mqar' / 'config.json').write_text(stored.to_json())
  assert sweep.status(runs[0], str(tmp_path), configs['mqar']) == 'partial'
  (tmp_path / 'mqar' / 'results.json').write_text(json.dumps({'steps': 4}))
  assert sweep.status(runs[0], str(tmp_path), configs['mqar']) == 'done'
  stored.model.d_model = 32  # another model is still another config
  (tmp_path / 'mqar' / 'config.json').write_text(stored.to_json())
  assert sweep.status(runs[0], str(tmp_path), configs['mqar']) == 'changed'

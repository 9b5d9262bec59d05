"""A new user's first run: TFDS's real download path, the default workdir, the log setup.

No test here reaches a network: the socket layer refuses every connection (and
name lookup), so each one behaves the same on a machine with or without
internet, and TFDS writes only to a temporary data_dir.
"""

import logging
import os
import re
import socket
import subprocess
import sys

import main_runner
import pytest

from configs import mnist
import data
from train import logs
from train import trainer
from train import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_NETWORK = "could not download mnist: no network; see README 'Data' for offline use"

# main.py as a user runs it, on a machine whose network refuses every connection.
# TFDS retries a failed connection 10 times with a growing backoff (about 3 minutes);
# one try shows the same failure.
NO_NETWORK_MAIN = r'''
import runpy, socket, sys
def refuse(*args, **kwargs):
  raise socket.gaierror(socket.EAI_NONAME, 'no network (refused by the test)')
socket.getaddrinfo = refuse
socket.socket.connect = refuse
from tensorflow_datasets.core.download import downloader
downloader.MAX_RETRIES = 0
sys.argv[0] = 'main.py'
runpy.run_path('main.py', run_name='__main__')
'''


@pytest.fixture
def no_network(monkeypatch):
  """Every name lookup and connection fails at once; returns the list of attempts."""
  attempts = []

  def refuse(*args, **kwargs):
    attempts.append(args)
    raise socket.gaierror(socket.EAI_NONAME, 'no network (refused by the test)')

  monkeypatch.setattr(socket, 'getaddrinfo', refuse)
  monkeypatch.setattr(socket.socket, 'connect', refuse)
  monkeypatch.setattr(socket.socket, 'connect_ex', refuse)
  from tensorflow_datasets.core.download import downloader  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(downloader, 'MAX_RETRIES', 0)
  return attempts


def test_tfds_download_without_network_is_one_line(no_network, tmp_path, monkeypatch):
  """The real builder.download_and_prepare of MNIST runs up to the network (so every
  module it imports on the way, importlib_resources included, resolves), and the
  refused connection reaches the user as one line, before the workdir is created."""
  from data import stream  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(stream, 'check_network', lambda builder: None)  # TFDS's own path
  config = mnist.get_config()
  config.dataset.data_dir = str(tmp_path / 'tfds')
  workdir = tmp_path / 'run'
  with pytest.raises(data.DownloadError) as e:
    trainer.train_and_evaluate(config, str(workdir))
  assert str(e.value) == NO_NETWORK
  assert no_network, 'TFDS never reached the socket layer'
  assert not workdir.exists()


def test_readme_has_the_data_section_the_message_names():
  with open(os.path.join(ROOT, 'README.md')) as f:
    readme = f.read()
  data = re.search(r'^### Data\n(.*?)^#', readme, re.M | re.S)
  assert data, "README.md has no '### Data' section"
  assert 'network' in data.group(1) and 'data_dir' in data.group(1)


def test_main_without_network_or_workdir(tmp_path):
  """`python main.py --config=configs/mnist.py` with no network: the first line names the
  workdir derived from the config (a hash of the override), the last is the one-line
  error, and no workdir is made."""
  data_dir = str(tmp_path / 'tfds')
  proc = subprocess.run(
    [
      sys.executable,
      '-c',
      NO_NETWORK_MAIN,
      '--config=configs/mnist.py',
      f'--config.dataset.data_dir={data_dir}',
    ],
    timeout=300,
    **main_runner.popen_kwargs(),
  )
  assert proc.returncode == 1, proc.stderr[-3000:]
  expected = workdir_lib.default_workdir('configs/mnist.py', {'dataset.data_dir': data_dir})
  assert re.fullmatch(r'runs/mnist-[0-9a-f]{8}', expected)
  assert proc.stdout.splitlines()[0] == f'workdir {expected}', proc.stdout
  assert (
    proc.stderr.strip()
    .splitlines()[-1]
    .startswith(
      'Error: could not download mnist: no network (storage.googleapis.com:443 cannot be '
      "reached); see README 'Data' for offline use, or train from .npz files ("
    )
  ), proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr
  assert "Unable to initialize backend 'tpu'" not in proc.stderr
  assert not os.path.exists(os.path.join(ROOT, expected))


@pytest.mark.parametrize(
  'arg,overrides,expected',
  [
    ('configs/cifar10_nystrom.py', None, 'runs/cifar10_nystrom'),
    ('configs/cifar10.py:linear', {}, 'runs/cifar10-linear'),
    ('./configs/default.py', None, 'runs/default'),
    (f'{ROOT}/configs/lra/listops.py:performer', None, 'runs/lra/listops-performer'),
    (
      'configs/cifar10.py:mechanism=local,projection=efficient,size=small',
      None,
      'runs/cifar10-mechanism-local-projection-efficient-size-small',
    ),
    ('configs/lora_finetune.py:rotated,8', None, 'runs/lora_finetune-rotated-8'),
    ('/tmp/my_experiment.py', None, 'runs/my_experiment'),
  ],
)
def test_default_workdir_names(arg, overrides, expected):
  assert workdir_lib.default_workdir(arg, overrides) == expected


def test_default_workdir_separates_overrides():
  """Another config (other overrides, other values) never gets the same folder; the same
  overrides in another order do."""
  base = workdir_lib.default_workdir('configs/cifar10.py:linear')
  heads8 = workdir_lib.default_workdir('configs/cifar10.py:linear', {'model.num_heads': 8})
  heads4 = workdir_lib.default_workdir('configs/cifar10.py:linear', {'model.num_heads': 4})
  both = workdir_lib.default_workdir(
    'configs/cifar10.py:linear', {'model.num_heads': 8, 'train.num_steps': 10}
  )
  swapped = workdir_lib.default_workdir(
    'configs/cifar10.py:linear', {'train.num_steps': 10, 'model.num_heads': 8}
  )
  assert len({base, heads8, heads4, both}) == 4
  assert both == swapped
  assert heads8.startswith(base + '-')


def test_default_workdir_of_an_evaluation_ignores_what_it_may_change():
  """`--mode=eval --config.dataset.eval_split=train` evaluates the run the same command
  without the override trained (runs/default), not a folder of its own that holds no run."""

  def eval_dir(overrides):
    return workdir_lib.default_workdir('configs/default.py', overrides, evaluating=True)

  assert eval_dir({'dataset.eval_split': 'train', 'dataset.eval_batch_size': 7}) == ('runs/default')
  assert eval_dir({'model.depth': 3}) == workdir_lib.default_workdir(
    'configs/default.py', {'model.depth': 3}
  )
  assert eval_dir({'model.depth': 3, 'dataset.eval_split': 'train'}) == eval_dir({'model.depth': 3})
  assert workdir_lib.default_workdir('configs/default.py', {'dataset.eval_split': 'train'}) != (
    'runs/default'
  )  # training: another config's folder


def test_eval_without_checkpoints_fails_before_opening_the_data(no_network, tmp_path):
  """--mode=eval of a workdir that holds no run says so at once (it first tried to download
  the dataset: minutes of TFDS retries, then a download error)."""
  config = mnist.get_config()
  config.dataset.data_dir = str(tmp_path / 'tfds')
  with pytest.raises(
    FileNotFoundError,
    match=r'^no checkpoints directory .*run/checkpoints; '
    r'--mode=eval reads a trained run',
  ):
    trainer.evaluate(config, str(tmp_path / 'run'))
  assert not no_network and not (tmp_path / 'run').exists()


def test_missing_tpu_notice_is_dropped_and_nothing_else(monkeypatch, caplog):
  """Without libtpu, JAX's "Unable to initialize backend 'tpu'" notice is dropped; the
  logger's other records (a GPU's, say) pass."""
  jax_logger = logging.getLogger('jax._src.xla_bridge')
  monkeypatch.setattr(jax_logger, 'filters', list(jax_logger.filters))
  monkeypatch.setattr(
    logs.importlib.util, 'find_spec', lambda name, *a: None if name == 'libtpu' else object()
  )
  verbosity = logs.logging.get_verbosity()
  try:
    logs.quiet_logs(verbosity_given=True)
  finally:
    logs.logging.set_verbosity(verbosity)
  with caplog.at_level(logging.INFO, logger='jax._src.xla_bridge'):
    jax_logger.info("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
    jax_logger.info("Unable to initialize backend 'cuda': no GPU")
  assert [r.getMessage() for r in caplog.records] == ["Unable to initialize backend 'cuda': no GPU"]


def test_benchmark_tools_drop_the_missing_tpu_notice(monkeypatch):
  """Every benchmarks/ tool parses its flags with `common.parse_flags`, which installs the
  same filter as main.py (`train.api.quiet_logs`)."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top

  jax_logger = logging.getLogger('jax._src.xla_bridge')
  monkeypatch.setattr(jax_logger, 'filters', [])
  monkeypatch.setattr(
    logs.importlib.util, 'find_spec', lambda name, *a: None if name == 'libtpu' else object()
  )
  common.parse_flags(lambda fv: None, [])
  assert [type(f) for f in jax_logger.filters] == [logs.NoMissingTpuNotice]


@pytest.mark.parametrize(
  'name',
  sorted(
    f[:-3]
    for f in os.listdir(os.path.join(ROOT, 'examples'))
    if f.endswith('.py') and f != '__init__.py'
  ),
)
def test_examples_quiet_the_logs_like_main(name, monkeypatch):
  """Each examples/ script's main calls `api.quiet_logs` (main.py's `logs.quiet_logs`, on the
  trainer's public face) first, so it prints no "Unable to initialize backend 'tpu'" notice
  either."""
  import importlib  # pylint: disable=g-import-not-at-top

  example = importlib.import_module(f'examples.{name}')

  class Called(Exception):
    pass

  def called(verbosity_given):
    raise Called(verbosity_given)

  from train import api  # pylint: disable=g-import-not-at-top

  assert api.quiet_logs is logs.quiet_logs
  monkeypatch.setattr(api, 'quiet_logs', called)
  with pytest.raises(Called):
    example.main([f'examples/{name}.py'])


def test_decoding_steps_are_exported_like_the_other_pure_functions():
  import efficient_attn as ea  # pylint: disable=g-import-not-at-top
  from efficient_attn.mechanisms import linear  # pylint: disable=g-import-not-at-top
  from efficient_attn.mechanisms import random_features  # pylint: disable=g-import-not-at-top

  assert ea.mechanisms.linear_attention_step is linear.linear_attention_step
  assert ea.mechanisms.performer_attention_step is random_features.performer_attention_step
  assert ea.mechanisms.rfa_attention_step is random_features.rfa_attention_step
  assert {'linear_attention', 'linear_attention_step'} <= set(dir(ea.mechanisms))


class _FailingBuilder:
  """Stands in for a TFDS builder whose download_and_prepare raises `error`."""

  name, data_dir = 'mnist', '/data/tfds/mnist/3.0.1'

  def __init__(self, error):
    self.error = error

  def download_and_prepare(self, download_config=None):
    del download_config
    raise self.error


@pytest.mark.parametrize(
  'error,message',
  [
    (socket.gaierror(socket.EAI_AGAIN, 'Temporary failure in name resolution'), NO_NETWORK),
    (ConnectionRefusedError(111, 'Connection refused'), NO_NETWORK),
    (
      'http_404',
      "could not download mnist: 404 Client Error: Not Found for url: "
      "https://example.org/mnist.gz; see README 'Data' for offline use",
    ),
    (
      PermissionError(13, 'Permission denied'),
      'could not prepare mnist in /data/tfds/mnist/3.0.1: [Errno 13] Permission denied',
    ),
  ],
)
def test_failed_tfds_preparation_is_one_line(error, message):
  """No network, a server's refusal and a disk error each give one line naming the
  dataset; only the first two point to offline use."""
  import requests  # pylint: disable=g-import-not-at-top

  from data import stream  # pylint: disable=g-import-not-at-top

  if error == 'http_404':
    error = requests.exceptions.HTTPError(
      '404 Client Error: Not Found for url: https://example.org/mnist.gz'
    )
  with pytest.raises(data.DownloadError) as e:
    stream._download_and_prepare(_FailingBuilder(error), None)  # pylint: disable=protected-access
  assert str(e.value) == message


def test_other_tfds_errors_pass_through():
  from data import stream  # pylint: disable=g-import-not-at-top

  builder = _FailingBuilder(ValueError('not a DownloadError'))
  with pytest.raises(ValueError, match='not a DownloadError'):
    stream._download_and_prepare(builder, None)  # pylint: disable=protected-access


def test_progress_line_eta_to_the_second():
  """The ETA is the remaining steps at the measured rate, to the second (clu's was in
  minutes); grad_norm and the learning rate stay out of the line; before a rate is
  measured (one step), '-'."""
  from train import metrics  # pylint: disable=g-import-not-at-top

  values = {'accuracy': 0.95466, 'grad_norm': 2.5, 'learning_rate': 1e-3, 'loss': 0.15638}
  assert metrics.progress_line(300, 660, values, 18.0, 64) == (
    'step 300/660 | loss 0.1564 | accuracy 95.47% | 1152 ex/s | eta 20s'
  )
  assert metrics.progress_line(1, 10_001, values, 2.0, 64).endswith('| 128 ex/s | eta 1h23m20s')
  assert metrics.progress_line(1, 660, values, None, 64).endswith('| - ex/s | eta -')
  assert [metrics.duration(s) for s in (0.4, 59.5, 61, 3599.6)] == [
    '0s',
    '1m00s',
    '1m01s',
    '1h00m00s',
  ]

"""Without a network, a TFDS dataset fails in seconds, with the command that trains from files.

TFDS retries a download that cannot connect ten times (about three and a half
minutes) before our one-line error; a short connection check to the dataset's
servers comes first (`data.stream.check_network`), only where TFDS would download.
No test here reaches a network: the socket layer refuses every name lookup.
"""

import os
import socket
import subprocess
import sys
import threading
import time

import main_runner
import numpy as np
import pytest

from configs import cifar10
from configs import imdb
from configs import mnist
import data
from data import stream
from train import cli
from train import trainer

ROOT = main_runner.ROOT

# main.py on a machine without a network, timed after its imports (TensorFlow's alone
# takes seconds on a busy CPU). TFDS's own download, if it ever starts, fails at once as
# it would after its retries.
OFFLINE_MAIN = r'''
import runpy, socket, sys, time
def refuse(*args, **kwargs):
  raise socket.gaierror(socket.EAI_NONAME, 'no network (refused by the test)')
socket.getaddrinfo = refuse
socket.socket.connect = refuse
import requests
import tensorflow_datasets as tfds
def download(self, *args, **kwargs):
  print('TFDS download started', flush=True)
  raise requests.exceptions.ConnectionError('no network (after the retries)')
tfds.core.DatasetBuilder.download_and_prepare = download
import data.stream, train.checkpoint, train.trainer  # the imports, before the clock
start = time.monotonic()
sys.argv[0] = 'main.py'
try:
  runpy.run_path('main.py', run_name='__main__')
finally:
  print(f'elapsed {time.monotonic() - start:.2f}', flush=True)
'''


@pytest.fixture
def no_network(monkeypatch):
  """Every name lookup and connection fails at once; TFDS's download raises what it would
  after its retries. Returns the list of downloads TFDS started."""

  def refuse(*args, **kwargs):
    raise socket.gaierror(socket.EAI_NONAME, 'no network (refused by the test)')

  monkeypatch.setattr(socket, 'getaddrinfo', refuse)
  monkeypatch.setattr(socket.socket, 'connect', refuse)
  import requests  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  downloads = []

  def download(self, *args, **kwargs):
    downloads.append(self.name)
    raise requests.exceptions.ConnectionError('no network (after the retries)')

  monkeypatch.setattr(tfds.core.DatasetBuilder, 'download_and_prepare', download)
  return downloads


def test_offline_command_fails_in_seconds_with_the_arrays_command(tmp_path):
  """The mission's command offline: one line within seconds (it took 3 min 38 s), giving
  the command again with source=arrays and, for the base CIFAR-10 ViT, the CPU size."""
  workdir = tmp_path / 'run'
  proc = subprocess.run(
    [
      sys.executable,
      '-c',
      OFFLINE_MAIN,
      '--config=configs/cifar10_nystrom.py',
      f'--workdir={workdir}',
      f'--config.dataset.data_dir={tmp_path / "tfds"}',
    ],
    timeout=300,
    **main_runner.popen_kwargs(),
  )
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert 'TFDS download started' not in proc.stdout
  elapsed = float(proc.stdout.splitlines()[-1].removeprefix('elapsed '))
  assert elapsed < 10, proc.stdout
  error = proc.stderr.strip().splitlines()[-1]
  assert error.startswith(
    'Error: could not download cifar10: no network (www.cs.toronto.edu:443 cannot be reached); '
  ), error
  assert (
    f"python main.py --config=configs/cifar10_nystrom.py --workdir={workdir} "
    f"--config.dataset.source=arrays "
    f"'--config.dataset.data_dir=<folder>/cifar10_{{split}}.npz'"
  ) in error
  assert 'cifar10_train.npz and cifar10_test.npz' in error
  assert str(tmp_path / 'tfds') not in error  # the TFDS data_dir flag gives way
  assert '--config=configs/cifar10.py:nystrom,size=small' in error
  assert 'Traceback' not in proc.stderr and not workdir.exists()


def test_train_and_evaluate_fails_before_tfds_downloads(no_network, tmp_path):
  config = mnist.get_config()
  config.dataset.data_dir = str(tmp_path / 'tfds')
  start = time.monotonic()
  with pytest.raises(
    data.DownloadError,
    match=r'^could not download mnist: no network '
    r'\(storage\.googleapis\.com:443 cannot be reached\); ',
  ):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert time.monotonic() - start < 10
  assert not no_network, 'TFDS started its download'
  assert not (tmp_path / 'run').exists()


def test_no_check_where_the_dataset_is_prepared(no_network, tmp_path):
  """A dataset prepared in the TFDS data_dir (its dataset_info.json; the examples mocked)
  is read without a connection attempt."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  tfds_dir = str(tmp_path / 'tfds')
  builder = tfds.builder('mnist', data_dir=tfds_dir)
  os.makedirs(builder.data_dir)
  builder.info.write_to_directory(builder.data_dir)
  config = mnist.get_config()
  config.dataset.update(dict(data_dir=tfds_dir, batch_size=4, eval_batch_size=4))
  checked = []
  original = stream.check_network
  stream_check = lambda builder, *a, **k: (checked.append(builder.name), original(builder, *a, **k))
  with pytest.MonkeyPatch.context() as m, tfds.testing.mock_data(num_examples=8, data_dir=tfds_dir):
    m.setattr(stream, 'check_network', stream_check)
    data.check_splits(config)
    batch = next(data.get_train_data(config).batches(0))
  assert batch['inputs'].shape == (4, 32, 32, 1)
  assert not checked and not no_network


def test_download_hosts_are_the_servers_or_their_proxy(monkeypatch):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  for name in (
    'http_proxy',
    'https_proxy',
    'no_proxy',
    'HTTP_PROXY',
    'HTTPS_PROXY',
    'NO_PROXY',
    'all_proxy',
    'ALL_PROXY',
  ):
    monkeypatch.delenv(name, raising=False)
  assert stream.download_hosts(tfds.builder('cifar10')) == [('www.cs.toronto.edu', 443)]
  assert stream.download_hosts(tfds.builder('mnist')) == [('storage.googleapis.com', 443)]
  assert stream.download_hosts(tfds.builder('imdb_reviews')) == [('ai.stanford.edu', 80)]
  monkeypatch.setenv('https_proxy', 'http://proxy.example:3128')
  assert stream.download_hosts(tfds.builder('cifar10')) == [('proxy.example', 3128)]
  assert stream.download_hosts(object()) == []  # no URLs listed: no check


def test_unreachable_within_the_timeout(monkeypatch):
  """A server that answers passes; a name lookup that hangs (a resolver out of reach)
  fails after the timeout, not the lookup's own minutes."""
  with socket.socket() as server:
    server.bind(('127.0.0.1', 0))
    server.listen()
    assert stream.unreachable([server.getsockname()], timeout=5) is None
  release = threading.Event()
  monkeypatch.setattr(socket, 'getaddrinfo', lambda *a, **k: release.wait(30) and [])
  start = time.monotonic()
  try:
    assert stream.unreachable([('www.cs.toronto.edu', 443)], timeout=0.3) == (
      'www.cs.toronto.edu:443'
    )
  finally:
    release.set()
  assert time.monotonic() - start < 2


@pytest.mark.parametrize(
  'get_config,x',
  [
    (lambda: cifar10.get_config('nystrom'), np.zeros((10, 32, 32, 3), np.uint8)),
    (mnist.get_config, np.zeros((10, 28, 28), np.uint8)),
    (imdb.get_config, None),
  ],
)
def test_the_arrays_command_reads_the_files_it_names(get_config, x, tmp_path):
  """The flags and files of the message train: .npz files as it describes them, in a
  folder put for '<folder>', pass the data checks."""
  config = get_config()
  flags, files = data.arrays_source(config)
  for name in files.split(',')[0].split(' and '):
    if x is None:  # text: UTF-8 bytes one after another, and where each text starts
      texts = [f'review {i}'.encode() for i in range(10)]
      np.savez(
        tmp_path / name,
        text_utf8=np.frombuffer(b''.join(texts), np.uint8),
        offsets=np.cumsum([0] + [len(t) for t in texts]),
        y=np.arange(10) % 2,
      )
    else:
      np.savez(tmp_path / name, x=x, y=np.arange(10))
  for flag in flags:
    key, value = flag.removeprefix('--config.dataset.').split('=', 1)
    config.dataset[key] = value.replace('<folder>', str(tmp_path))
  config.dataset.update(dict(batch_size=2, eval_batch_size=2))
  data.check_splits(config)


def test_offline_hint_repeats_the_command_and_the_cpu_size():
  config = cifar10.get_config('mechanism=linear,projection=efficient')
  argv = [
    'main.py',
    '--config=configs/cifar10.py:mechanism=linear,projection=efficient',
    '--config.dataset.data_dir=/somewhere/tfds',
    '--config.dataset.source',
    'tfds',
    '--workdir=runs/my run',
  ]
  hint = cli.offline_hint(argv, argv[1].split('=', 1)[1], config)
  assert (
    "python main.py --config=configs/cifar10.py:mechanism=linear,projection=efficient "
    "'--workdir=runs/my run' --config.dataset.source=arrays "
    "'--config.dataset.data_dir=<folder>/cifar10_{split}.npz'"
  ) in hint
  assert 'somewhere' not in hint and ' tfds' not in hint
  assert '--config=configs/cifar10.py:linear,projection=efficient,size=small' in hint
  cifar10.get_config('linear,projection=efficient,size=small')  # a valid argument
  small = cifar10.get_config('nystrom,size=small')
  assert 'size=small' not in cli.offline_hint(
    ['main.py'], 'configs/cifar10.py:nystrom,size=small', small
  )
  assert 'size=small' not in cli.offline_hint(['main.py'], 'configs/mnist.py', mnist.get_config())

"""Training runs that several test files share, each trained once per session (`run_once`)."""

import contextlib

import main_runner

V, L, P = 64, 32, 4  # the tiny MQAR task: vocabulary, length, key-value pairs
TINY_MQAR = (
  f'softmax,d_model=32,seq_len={L},num_kv_pairs={P},vocab_size={V},num_train=512,num_steps=24'
)
MQAR_SIZES = ('--config.dataset.sizes.validation=64', '--config.dataset.sizes.test=64')


def parse_mqar(*args, arg='softmax'):
  """The config main.py builds from `--config=configs/mqar.py:<arg> *args`."""
  return main_runner.parsed_config(f'configs/mqar.py:{arg}', *args)


def train_default(workdir):
  """Trains the default config in `workdir`; what it prints goes to `<workdir>.stdout`."""
  from configs import default as default_config  # pylint: disable=g-import-not-at-top
  from train import trainer  # pylint: disable=g-import-not-at-top

  with open(f'{workdir}.stdout', 'w') as out, contextlib.redirect_stdout(out):
    trainer.train_and_evaluate(default_config.get_config(), workdir)


def train_tiny_mqar(workdir):
  """The tiny MQAR run of tests/data/test_mqar.py, as main.py runs it."""
  from train import trainer  # pylint: disable=g-import-not-at-top

  config = parse_mqar(
    f'--config.dataset.data_dir={workdir}_data',
    '--config.train.log_every=12',
    *MQAR_SIZES,
    arg=TINY_MQAR,
  )
  trainer.train_and_evaluate(config, workdir)

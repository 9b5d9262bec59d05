"""main.py's one-line errors (issue 70, items 6 and 12): a missing --config, a config file
that does not load or whose get_config raises or returns nothing, Ctrl-C outside the
training loop, XLA running out of memory; and TensorFlow's start-up notices kept off
stderr."""

import os
import sys

from absl import flags
import jax
from ml_collections import config_flags
import pytest

from train import cli
from train import logs

BAD_FILES = {
  'syntax.py': ('def get_config(:\n  pass\n', "does not load: SyntaxError: invalid syntax"),
  'name.py': (
    'def get_config():\n  return undefined_name\n',
    "get_config() raised NameError: name 'undefined_name' is not defined (line 2)",
  ),
  'imports.py': (
    'import no_such_module\n\ndef get_config():\n  return None\n',
    "does not load: ModuleNotFoundError: No module named 'no_such_module'",
  ),
  'none.py': ('def get_config():\n  return None\n', 'get_config() returned None; it must return'),
  'absent.py': ('X = 1\n', 'defines no get_config()'),
}


def _parse(argv):
  """SystemExit's message of `cli.parse_flags(argv)` with main.py's --config flag."""
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values, sys_argv=argv)
  with pytest.raises(SystemExit) as exited:
    cli.parse_flags(argv, values)
  message = str(exited.value)
  assert len(message.splitlines()) == 1 and 'Traceback' not in message, message
  return message


@pytest.mark.parametrize('name', sorted(BAD_FILES))
def test_a_config_file_that_gives_no_config_is_one_line(tmp_path, name):
  source, expected = BAD_FILES[name]
  path = tmp_path / name
  path.write_text(source)
  message = _parse(['main.py', f'--config={path}'])
  assert message.startswith(f'Error: flag --config={path}: '), message
  assert expected in message, message


def test_without_config_the_line_names_the_flag_and_the_quick_start():
  message = _parse(['main.py'])
  assert message.startswith('Error: --config is missing: '), message
  assert f'--config={cli.QUICK_START}' in message
  assert os.path.isfile(os.path.join(os.path.dirname(cli.__file__), '..', cli.QUICK_START))


def test_ctrl_c_outside_the_training_loop_is_one_line_and_status_130(monkeypatch, capsys):
  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(cli, 'run_or_fail', interrupted)
  with pytest.raises(SystemExit) as exited:
    cli.run(None, workdir='unused', mode='train', restart=False, verbose=False, distributed={})
  assert exited.value.code == 130
  assert capsys.readouterr().err.startswith('Interrupted (Ctrl-C); re-run the same command')


def test_tensorflow_imported_later_by_anything_leaves_out_its_notices(tmp_path, monkeypatch, capfd):
  """`quiet_tensorflow_import`: the first `import tensorflow`, wherever it comes from (TFDS,
  tf.data), drops the C++ notices and passes on the rest; until then nothing is loaded."""
  package = tmp_path / 'tensorflow'
  package.mkdir()
  (package / '__init__.py').write_text(
    'import os\n'
    "os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called\\n')\n"
    "os.write(2, b'I0000 port.cc:153] oneDNN custom operations are on. You may see\\n')\n"
    "os.write(2, b'I0000 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\\n')\n"
    "os.write(2, b'something a user must see\\n')\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  for name in [m for m in sys.modules if m.split('.')[0] == 'tensorflow']:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.setattr(sys, 'meta_path', list(sys.meta_path))
  logs.quiet_tensorflow_import()
  assert 'tensorflow' not in sys.modules
  try:
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    assert sys.modules['tensorflow'].__file__ == str(package / '__init__.py')
  finally:
    sys.modules.pop('tensorflow', None)  # the real one (if any) comes back with monkeypatch
  assert capfd.readouterr().err == 'something a user must see\n'
  assert not any(isinstance(f, logs._QuietTensorFlowFinder) for f in sys.meta_path)  # pylint: disable=protected-access


def test_out_of_memory_is_one_line_naming_the_allocation_and_what_to_lower(tmp_path, monkeypatch):
  """XLA's RESOURCE_EXHAUSTED (an allocation the memory check cannot foresee: LRA ListOps
  with Performer asked for 28 GB on a 24 GB host) exits with one line; other runtime
  errors keep their traceback."""

  def exhausted(*args, **kwargs):
    raise jax.errors.JaxRuntimeError(
      'RESOURCE_EXHAUSTED: Out of memory allocating 28482013984 bytes.'
    )

  monkeypatch.setattr(cli.trainer, 'train_and_evaluate', exhausted)
  values = flags.FlagValues()
  root = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
  argv = ['main.py', f'--config={os.path.join(root, cli.QUICK_START)}']
  config_flags.DEFINE_config_file('config', flag_values=values, sys_argv=argv)
  cli.parse_flags(argv, values)
  options = dict(mode='train', restart=False, verbose=False, distributed={'mode': 'off'})
  with pytest.raises(SystemExit) as exited:
    cli.run_or_fail(values['config'], workdir=str(tmp_path / 'run'), **options)
  message = str(exited.value)
  assert len(message.splitlines()) == 1, message
  assert message.startswith('Error: out of memory (Out of memory allocating 28482013984 bytes.)')
  assert 'config.dataset.batch_size' in message and 'the same command resumes' in message
  assert cli.out_of_memory(jax.errors.JaxRuntimeError('INTERNAL: other'), 'w') is None

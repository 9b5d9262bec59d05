"""train.pyfile (configs and sweeps loaded by path) and their settings after ':'."""

import os

import pytest

from configs import common
from train import pyfile


def test_function_loads_a_file_and_names_every_failure(tmp_path):
  (tmp_path / 'ok.py').write_text('def get_config(arg=None):\n  return arg or "default"\n')
  assert pyfile.function(str(tmp_path / 'ok.py'), 'get_config')('x') == 'x'
  with pytest.raises(ValueError, match=r"'.*nope.py' does not exist"):
    pyfile.function(str(tmp_path / 'nope.py'), 'get_config')
  with pytest.raises(ValueError, match=r"'configs' is not a Python file"):
    pyfile.function('configs', 'get_config')
  (tmp_path / 'broken.py').write_text('x = 1 / 0\n')
  with pytest.raises(ValueError, match='broken.py.* does not load: ZeroDivisionError'):
    pyfile.function(str(tmp_path / 'broken.py'), 'get_config')
  (tmp_path / 'other.py').write_text('get_sweep = 3\n')  # defined, but not a function
  with pytest.raises(ValueError, match=r'other.py.* defines no get_sweep\(\)'):
    pyfile.function(str(tmp_path / 'other.py'), 'get_sweep')


def test_call_passes_the_argument_and_names_every_failure(tmp_path):
  (tmp_path / 'sweep.py').write_text(
    'from configs import common\n'
    'def get_sweep(arg=None):\n'
    '  return common.parse_arg(arg, seed=0, aan_dir="")\n'
  )
  (tmp_path / 'plain.py').write_text('def get_sweep():\n  return "plain"\n')
  path = str(tmp_path / 'sweep.py')
  assert pyfile.call(path, 'get_sweep') == {'seed': 0, 'aan_dir': ''}
  assert pyfile.call(f'{path}:seed=1,aan_dir=gs://b/tsv', 'get_sweep') == {
    'seed': 1,
    'aan_dir': 'gs://b/tsv',
  }  # the argument starts at the first ':'
  assert pyfile.call(str(tmp_path / 'plain.py'), 'get_sweep') == 'plain'
  with pytest.raises(ValueError, match=r"^'.*plain.py' takes no argument; got 'seed=1'$"):
    pyfile.call(str(tmp_path / 'plain.py:seed=1'), 'get_sweep')
  with pytest.raises(
    ValueError,
    match=r"^'.*sweep.py:seed=one': config argument 'seed=one': "
    r"seed='one' is not a valid int$",
  ):
    pyfile.call(f'{path}:seed=one', 'get_sweep')
  with pytest.raises(ValueError, match=r"'.*nope.py' does not exist"):
    pyfile.call(str(tmp_path / 'nope.py:seed=1'), 'get_sweep')


def test_parse_arg_reads_settings_and_names_bad_ones():
  """Settings after ':' (configs and sweeps): integers, lists and names, one-line errors."""
  defaults = dict(n=7, seeds=(0, 1), names=('a', 'b'), flag=False)
  assert common.parse_arg(None, **defaults) == defaults
  assert common.parse_arg('', **defaults) == defaults
  assert common.parse_arg('3,seeds=2,5,,names=softmax,linear,flag=true', **defaults) == dict(
    n=3, seeds=(2, 5), names=('softmax', 'linear'), flag=True
  )
  assert common.parse_arg('names=x', **defaults)['names'] == ('x',)
  with pytest.raises(ValueError, match=r"^config argument 'n=2.5': n='2.5' is not a valid int$"):
    common.parse_arg('n=2.5', **defaults)
  with pytest.raises(ValueError, match=r"seeds='x' is not a valid int$"):
    common.parse_arg('seeds=1,x', **defaults)
  with pytest.raises(ValueError, match=r"unknown key 'N'; valid keys: n, seeds, names, flag$"):
    common.parse_arg('N=3', **defaults)
  with pytest.raises(ValueError, match=r'names= names nothing; give one or more values$'):
    common.parse_arg('names=,n=1', **defaults)
  with pytest.raises(ValueError, match='must come before any key=value; valid keys, in order'):
    common.parse_arg('n=1,2', **defaults)
  common.at_least(0, seed=0, seeds=(0, 3))
  with pytest.raises(ValueError, match=r'^epochs=0 is not valid; it must be >= 1$'):
    common.at_least(1, epochs=0)
  with pytest.raises(ValueError, match=r'^seeds=-2 is not valid; it must be >= 0$'):
    common.at_least(0, seeds=(1, -2))


def _override_error(*overrides):
  """main.py's one line for `--config=configs/default.py` with `overrides`."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  config = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "configs", "default.py"
  )
  argv = ['main.py', f'--config={config}', *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values, sys_argv=argv)
  with pytest.raises(Exception) as e:
    values(argv)
  return pyfile.config_flag_error(e.value, argv)


def test_an_unknown_override_names_the_valid_fields_of_its_group():
  assert _override_error('--config.model.num_head=4') == (
    "Invalid config override --config.model.num_head: no field 'num_head'; did you mean "
    '"num_heads" instead of "num_head"?'
  )  # a close name: ml_collections' hint
  message = _override_error('--config.attention.options.nope=3')  # none: the group's fields
  assert message.startswith(
    "Invalid config override --config.attention.options.nope: no field 'nope'; valid: "
  ), message
  assert 'num_landmarks' in message and 'value_factor' in message and '\n' not in message
  assert _override_error('--config.optim.zzz=1').endswith(
    f'valid: {", ".join(sorted(common.base().optim.keys()))}'
  )

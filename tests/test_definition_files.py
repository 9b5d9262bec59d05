"""train.pyfile (configs and sweeps loaded by path) and train.env (sweep settings)."""
import pytest

from train import env
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


def test_env_reads_settings_and_names_bad_ones(monkeypatch):
  for name in ('N', 'LIST', 'NAMES'):
    monkeypatch.delenv(name, raising=False)
  assert env.integer('N', 7) == 7
  assert env.integers('LIST', '0,1') == [0, 1]
  assert env.names('NAMES', 'a,b') == ['a', 'b']
  monkeypatch.setenv('N', ' 3 ')
  monkeypatch.setenv('LIST', '2, 5,')
  monkeypatch.setenv('NAMES', 'softmax, ,linear')
  assert env.integer('N', 7) == 3
  assert env.integers('LIST', '0,1') == [2, 5]
  assert env.names('NAMES', 'a') == ['softmax', 'linear']
  monkeypatch.setenv('N', '2.5')
  with pytest.raises(ValueError, match=r"^N='2.5' is not an integer$"):
    env.integer('N', 7)
  monkeypatch.setenv('N', '0')
  with pytest.raises(ValueError, match='N=0 is not valid; it must be >= 1'):
    env.integer('N', 7, minimum=1)
  monkeypatch.setenv('LIST', '1,x')
  with pytest.raises(ValueError, match=r"LIST='1,x' is not a comma-separated list of integers"):
    env.integers('LIST', '0')
  monkeypatch.setenv('LIST', '1,-2')
  with pytest.raises(ValueError, match='LIST: -2 is not valid; every value must be >= 0'):
    env.integers('LIST', '0')
  monkeypatch.setenv('NAMES', '  ')
  assert env.names('NAMES', 'a') == ['a']  # blank is unset
  monkeypatch.setenv('NAMES', ' , ')
  with pytest.raises(ValueError, match='NAMES names nothing'):
    env.names('NAMES', 'a')

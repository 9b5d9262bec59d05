"""benchmarks.lra_table: LRA's Table 1 from workdirs (written here, no training)."""

import json

import helpers
import pytest

from benchmarks import lra_table


def _workdir(root, name, config_path, arg, accuracy):
  path = root / name
  path.mkdir()
  config = helpers.load_config(config_path, arg)
  (path / 'config.json').write_text(config.to_json_best_effort())
  if accuracy is not None:
    (path / 'results.json').write_text(json.dumps({'eval_accuracy': accuracy, 'steps': 10}))
  return str(path)


def test_table_from_workdirs(tmp_path):
  runs = tmp_path / 'runs'
  runs.mkdir()
  _workdir(runs, 'listops-linear-0', 'configs/lra/listops.py', 'linear,size=small', 0.30)
  _workdir(runs, 'listops-linear-1', 'configs/lra/listops.py', 'linear,size=small', 0.40)
  _workdir(runs, 'pathfinder-linear', 'configs/lra/pathfinder.py', 'linear,size=small', 0.6)
  _workdir(runs, 'listops-softmax', 'configs/lra/listops.py', 'softmax,size=small', 0.375)
  _workdir(
    runs, 'image-nystrom', 'configs/lra/image.py', 'mechanism=nystrom,projection=super', None
  )  # unfinished
  _workdir(
    runs, 'retrieval-linear', 'configs/lra/retrieval.py', 'linear,size=small,data_dir=tsv_data', 0.5
  )
  _workdir(runs, 'mnist', 'configs/mnist.py', 'standard', 0.99)  # not an LRA run
  out = tmp_path / 'out'
  data = lra_table.main([f'{runs}/*', f'--out={out}', '--quiet'])
  assert data['ours']['linear'] == {
    'ListOps': [30.0, 40.0],
    'Pathfinder': [60.0],
    'Retrieval': [50.0],
  }
  assert data['ours']['softmax'] == {'ListOps': [37.5]}
  assert 'nystrom+super' not in data['ours']
  text = (out / 'lra.md').read_text()
  assert '| linear | 35.00 (2) | 50.00 | 60.00 | 48.33 |' in text  # mean of 2 seeds; average
  assert '| softmax | 37.50 | – | – |' in text  # no Pathfinder run: no average
  assert '| softmax | Transformer | 36.37 | 64.27 | 57.46 | 42.44 | 71.40 | 54.39 |' in text
  assert 'lengths 64-256' in text and '16x16, contour length 6' in text
  assert '10,000 train / 1,000 validation / 1,000 test' in text and '1 layer x 32' in text
  assert '| sinkhorn | Sinkhorn Trans. | 33.67 | 61.20 | 53.83 | 41.23 | 67.45 | 51.39 |' in text
  assert '2 x 1000 bytes' in text
  assert 'Unfinished' in text and 'image-nystrom' in text
  assert (out / 'lra.png').exists()


def test_no_lra_workdirs(tmp_path):
  with pytest.raises(SystemExit, match='no Long Range Arena workdirs'):
    lra_table.main([str(tmp_path), f'--out={tmp_path}', '--quiet'])

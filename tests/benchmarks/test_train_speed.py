"""benchmarks.train_speed: two configs timed side by side (tiny batch, two rounds)."""

import json

import pytest

from benchmarks import train_speed


@pytest.mark.slow
def test_two_configs_side_by_side(tmp_path):
  specs = ['configs/mnist.py:standard', 'configs/mnist.py:efficient']
  data = train_speed.main(
    [f'--config={s}' for s in specs]
    + [
      '--batch_size=2',
      '--rounds=2',
      '--steps=1',
      '--examples_per_epoch=54000',
      f'--out={tmp_path}',
      '--quiet',
    ]
  )
  assert data['configs'] == specs
  standard, efficient = (data['points'][s] for s in specs)
  # The trainer's models: the parameter counts of studies/mnist_projections/README.md.
  assert (standard['params'], efficient['params']) == (276_874, 210_826)
  assert standard['relative_speed'] == 1.0
  for p in (standard, efficient):
    assert len(p['round_step_s']) == 2 and p['batch_size'] == 2
    assert p['fastest_round_s'] <= p['step_s'] <= p['slowest_round_s']
    assert p['examples_per_s'] == pytest.approx(2 / p['step_s'])
    assert p['epoch_s'] == pytest.approx(54000 * p['step_s'] / 2)
  assert efficient['relative_speed'] == pytest.approx(standard['step_s'] / efficient['step_s'])
  saved = json.loads((tmp_path / 'train_speed.json').read_text())
  assert saved['meta']['rounds'] == 2
  text = (tmp_path / 'train_speed.md').read_text()
  assert '| configs/mnist.py:efficient | 210,826 | 2 |' in text
  assert (tmp_path / 'train_speed.png').exists()


def test_a_bad_config_is_named(tmp_path):
  with pytest.raises(SystemExit, match="'configs/nope.py' does not exist"):
    train_speed.main(['--config=configs/nope.py', f'--out={tmp_path}', '--quiet'])
  with pytest.raises(SystemExit, match='given twice'):
    train_speed.main(['--config=configs/mnist.py', '--config=configs/mnist.py', '--quiet'])
  with pytest.raises(SystemExit, match='--rounds=0'):
    train_speed.main(['--config=configs/mnist.py', '--rounds=0', '--quiet'])
  with pytest.raises(SystemExit, match='--batch_size=0'):  # not the config's batch, silently
    train_speed.main(['--config=configs/mnist.py', '--batch_size=0', '--quiet'])
  with pytest.raises(SystemExit, match='--examples_per_epoch=-5'):
    train_speed.main(['--config=configs/mnist.py', '--examples_per_epoch=-5', '--quiet'])
  with pytest.raises(SystemExit, match=r"'benchmarks/common.py' defines no get_config\(\)"):
    train_speed.main(['--config=benchmarks/common.py', '--quiet'])
  with pytest.raises(SystemExit, match="projection='bogus' is not valid"):
    train_speed.main(['--config=configs/mnist.py:bogus', f'--out={tmp_path}', '--quiet'])


def test_round_axis_has_whole_number_ticks(tmp_path, monkeypatch):
  """Rounds are counted: the speed plot must not label round 1.5 (it did, with 2-5 rounds)."""
  from matplotlib import pyplot as plt

  from benchmarks import output

  figures = []
  monkeypatch.setattr(output, 'save_figure', lambda fig, path: figures.append(fig) or path)
  series = {'a': ([1, 2], [3.0, 4.0])}
  for integer_x in (False, True):
    output.line_plot(
      str(tmp_path / 'p.png'),
      [('t', series)],
      xlabel='round',
      ylabel='ms',
      logx=False,
      logy=False,
      integer_x=integer_x,
    )
  ticks = [[t for t in f.axes[0].get_xticks() if 1 <= t <= 2] for f in figures]
  for f in figures:
    plt.close(f)
  assert any(t != int(t) for t in ticks[0])  # matplotlib's default puts ticks at 1.2, 1.4, ...
  assert ticks[1] and all(t == int(t) for t in ticks[1])


@pytest.mark.parametrize(
  'spec, k',
  [
    ('configs/mqar.py:linear,vocab_size=64,seq_len=16,num_kv_pairs=2,d_model=16,num_heads=1', 2),
  ],
)
def test_a_sequence_task_gets_scored_position_labels(spec, k):
  """MQAR's synthetic batch carries (position, token) label pairs, one per query, and the
  trainer's step compiles and runs on it (it failed on a [batch] label before)."""
  config = train_speed.load_config(spec)
  batch = train_speed.synthetic_batch(config, 2)
  assert batch['label'].shape == (2, k, 2)
  assert batch['label'][0, :, 0].tolist() == [14, 15]
  compiled, state, device_batch, _ = train_speed.compiled_train_step(config, batch)
  _, metrics = compiled(state, device_batch)
  assert float(metrics['count']) > 0

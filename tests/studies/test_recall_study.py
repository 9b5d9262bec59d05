"""The MQAR recall study (studies/recall): its runs, its settings, its decode-state column
and its gradient probe."""

import json
import re
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import shared_runs

from efficient_attn import registry
from studies.recall import decode_state
from studies.recall import gradients
from studies.recall import plots
from studies.recall import report
from studies.recall import run_records
from studies.recall import study_plan
from studies.recall import tables
from train import pyfile
from train import sweep

SWEEP = 'studies/recall/sweep.py'


def test_runs_are_named_by_mechanism_width_and_cell():
  runs = sweep.expand(
    sweep.load_sweep(
      f'{SWEEP}:mechanisms=softmax,deltanet,widths=64,128,cells=256x16,seed=1,num_steps=10'
    )
  )
  assert [r.name for r in runs] == [
    'softmax-d64-l256-kv16',
    'deltanet-d64-l256-kv16',
    'softmax-d128-l256-kv16',
    'deltanet-d128-l256-kv16',
  ]
  assert runs[3].config == (
    'configs/mqar.py:deltanet,d_model=128,seq_len=256,num_kv_pairs=16,vocab_size=1024,num_steps=10'
  )
  assert runs[0].overrides['train.seed'] == 1
  assert runs[0].overrides['optim.learning_rate'] == 1e-3  # budget D, the grid's
  [run] = sweep.expand(sweep.load_sweep(f'{SWEEP}:mechanisms=softmax'))
  assert run.config.endswith('vocab_size=1024,num_steps=4000')


@pytest.mark.parametrize(
  'arg,message',
  [
    ('cells=128-8', "cell '128-8' is not valid"),
    ('learning_rate=0', 'learning_rate=0.0 is not valid'),
    ('widths=0', 'widths=0 is not valid'),
  ],
)
def test_bad_settings_fail_in_one_line(arg, message):
  with pytest.raises(sweep.SweepError, match=message) as e:
    sweep.load_sweep(f'{SWEEP}:{arg}')
  assert '\n' not in str(e.value)


def _config(mechanism, seq_len):
  return pyfile.call(
    f'configs/mqar.py:{mechanism},d_model=8,seq_len={seq_len},'
    f'num_kv_pairs=2,vocab_size=16,num_heads=2',
    'get_config',
  )


def test_decode_state_is_a_kv_cache_for_softmax_and_constant_for_linear():
  counters = 3 * 4  # each layer's int32 cache index and the model's position
  for seq_len in (16, 32):  # 2 layers x (keys, values) x seq_len x width x float32
    assert (
      decode_state.state_bytes(_config('softmax', seq_len)) == 2 * 2 * seq_len * 8 * 4 + counters
    )
  # 2 layers x 2 heads x (S [4, 4] + z [4] + a log-scale) float32, whatever the length, and
  # each layer's int32 segment id of its row (packed rows: the last real token's document)
  segment_ids = 2 * 4
  assert (
    decode_state.state_bytes(_config('linear', 16))
    == 2 * 2 * (4 * 4 + 4 + 1) * 4 + counters + segment_ids
  )
  assert decode_state.state_bytes(_config('linear', 32)) == decode_state.state_bytes(
    _config('linear', 16)
  )
  assert decode_state.state_bytes(_config('reformer', 16)) is None  # no decoding form


def test_seeds_give_the_mean_and_half_the_range():
  runs = [
    dict(
      mechanism='linear',
      width=8,
      seq_len=16,
      num_kv_pairs=2,
      vocab_size=16,
      learning_rate=1e-2,
      steps=10,
      seed=s,
      accuracy=a,
      train_accuracy=a,
      examples_per_sec=1.0,
      params=1,
      state_bytes=7,
      workdir=f'w{s}',
    )
    for s, a in ((1, 0.5), (0, 0.25))
  ]
  [row] = tables.group(runs)
  assert row['seeds'] == [0, 1] and row['accuracy'] == [0.25, 0.5] and row['state_bytes'] == 7
  assert row['mean'] == pytest.approx(0.375) and row['spread'] == pytest.approx(0.125)


def test_a_run_with_an_option_off_its_default_is_its_own_row():
  config = _config('deltanet', 16)
  assert run_records.label(config) == 'deltanet'
  config.attention.options.conv_size = 0
  assert run_records.label(config) == 'deltanet conv_size=0'


def test_conv_size_turns_the_short_convolution_off_in_named_runs():
  [run] = sweep.expand(sweep.load_sweep(f'{SWEEP}:mechanisms=deltanet,conv_size=0'))
  assert run.name == 'deltanet-d64-l128-kv8-conv0'
  assert run.overrides['attention.options.conv_size'] == 0
  [run] = sweep.expand(sweep.load_sweep(f'{SWEEP}:mechanisms=deltanet'))
  assert 'attention.options.conv_size' not in run.overrides


@pytest.mark.parametrize(
  'arg, name, label, default, bad, message',
  [
    # Based's linear attention alone: linear's options
    (
      'mechanisms=linear,feature_map=taylor,qk_dim=16',
      'linear-d64-l128-kv8-taylor-qk16',
      'linear feature_map=taylor qk_dim=16',
      'mechanisms=linear,feature_map=elu',
      'mechanisms=softmax,feature_map=taylor',
      r"softmax-d64-l128-kv8-taylor: .*unknown option\(s\) \['feature_map'\]",
    ),
    # Based's hybrid: a pattern, its options shared out by mechanism
    (
      'mechanisms=linear+local,feature_map=taylor,qk_dim=16,window=64',
      'linear+local-d64-l128-kv8-taylor-qk16-w64',
      'linear+local feature_map=taylor qk_dim=16 window=64',
      'mechanisms=linear+local,window=32',
      'mechanisms=linear+softmax,window=64',
      r"linear\+softmax-d64-l128-kv8-w64: .*'window' is not an option of any mechanism of "
      r"'linear\+softmax'",
    ),
  ],
)
def test_based_runs_are_named_by_their_options_and_refused_where_they_are_not(
  arg, name, label, default, bad, message
):
  [run] = sweep.expand(sweep.load_sweep(f'{SWEEP}:{arg}'))
  assert run.name == name
  assert run_records.label(sweep.build_config(run)) == label
  mechanism = arg.split(',')[0].split('=')[1]
  [run] = sweep.expand(sweep.load_sweep(f'{SWEEP}:mechanisms={mechanism}'))
  assert not any(k.startswith('attention.options.') for k in run.overrides)
  [run] = sweep.expand(sweep.load_sweep(f'{SWEEP}:{default}'))
  assert run.name == f'{mechanism}-d64-l128-kv8'  # its defaults: the same run as without
  with pytest.raises(sweep.SweepError, match=message):
    sweep.check(sweep.expand(sweep.load_sweep(f'{SWEEP}:{bad}')))


def test_a_long_label_is_wrapped_in_legends_at_its_options():
  assert plots.legend_label('softmax') == 'softmax'
  assert plots.legend_label('linear+local feature_map=taylor qk_dim=16 window=64') == (
    'linear+local\nfeature_map=taylor\nqk_dim=16 window=64'
  )


def test_num_heads_names_the_run_and_its_row():
  [run] = sweep.expand(sweep.load_sweep(f'{SWEEP}:mechanisms=softmax,widths=128,num_heads=4'))
  assert run.name == 'softmax-d128-l128-kv8-h4'
  config = sweep.build_config(run)
  assert config.model.num_heads == 4 and run_records.label(config) == 'softmax heads=4'
  [run] = sweep.expand(sweep.load_sweep(f'{SWEEP}:mechanisms=softmax'))
  assert run.name == 'softmax-d64-l128-kv8' and sweep.build_config(run).model.num_heads == 2
  assert run_records.label(sweep.build_config(run)) == 'softmax'
  with pytest.raises(sweep.SweepError, match='num_heads=3 does not divide .*d_model=64'):
    sweep.check(sweep.expand(sweep.load_sweep(f'{SWEEP}:mechanisms=softmax,num_heads=3')))


def test_runs_at_two_budgets_are_two_rows_and_the_table_names_the_budget():
  runs = [
    dict(
      mechanism='softmax',
      width=8,
      seq_len=16,
      num_kv_pairs=2,
      vocab_size=16,
      learning_rate=lr,
      steps=steps,
      seed=0,
      accuracy=a,
      train_accuracy=a,
      examples_per_sec=1.0,
      params=1,
      state_bytes=None,
      workdir=f'w{steps}',
    )
    for lr, steps, a in ((1e-2, 10, 0.25), (3e-3, 50, 0.75))
  ]
  rows = tables.group(runs)
  assert [r['mean'] for r in rows] == [0.75, 0.25]
  table = tables.markdown(rows, 'cmd').splitlines()
  assert '| budget |' in table[2]
  assert '| 50 steps, lr 0.003, vocab 16 | 75.00 ± 0.00% |' in table[4]
  assert '| budget |' not in tables.markdown(rows[:1], 'cmd')  # one budget: no column


def test_plot_gives_each_mechanism_one_colour_in_lines_and_bars(tmp_path, monkeypatch):
  import matplotlib.colors  # pylint: disable=g-import-not-at-top
  import matplotlib.figure  # pylint: disable=g-import-not-at-top

  runs = [
    dict(
      mechanism=m,
      width=w,
      seq_len=n,
      num_kv_pairs=2,
      vocab_size=16,
      learning_rate=lr,
      steps=10,
      seed=0,
      accuracy=0.5,
      train_accuracy=0.5,
      examples_per_sec=1.0,
      params=1,
      state_bytes=None,
      workdir='w',
    )
    for m in ('softmax', 'linear')
    for lr in (1e-2, 3e-3)
    for w, n in ((8, 16), (16, 16), (8, 32))
  ]  # (32, 2) at one width: bars
  figures = []
  monkeypatch.setattr(
    matplotlib.figure.Figure, 'savefig', lambda fig, path, **kw: figures.append((fig, kw))
  )
  plots.plot_accuracy(tables.group(runs), str(tmp_path / 'p.png'))
  ((figure, kw),) = figures
  assert kw.get('bbox_inches') == 'tight'  # legends beside the panels are not cut off
  lines_ax, bars_ax = figure.axes
  line_colour = {
    label.replace('\n', ' '): matplotlib.colors.to_hex(bars.lines[0].get_color())
    for bars, label in zip(*lines_ax.get_legend_handles_labels())
  }
  names = [t.get_text() for t in bars_ax.get_xticklabels()]
  bar_colour = [
    matplotlib.colors.to_hex(b.get_facecolor(), keep_alpha=False) for b in bars_ax.patches
  ]
  assert sorted(names) == sorted(line_colour) and len(names) == 4
  assert [line_colour[n] for n in names] == bar_colour
  assert len({c.split()[0] for c in line_colour}) == 2 and len(set(bar_colour)) == 2


def test_colours_stay_distinct_past_the_default_cycle():
  import matplotlib.colors  # pylint: disable=g-import-not-at-top

  for n in (2, 12, 20):
    runs = [dict(mechanism=f'm{i:02d}') for i in range(n)]
    hexes = [matplotlib.colors.to_hex(c) for c in plots.colours(runs).values()]
    assert len(set(hexes)) == n, n


def test_state_plot_draws_a_line_per_mechanism_cell_and_budget_in_the_mechanisms_colour(
  tmp_path, monkeypatch
):
  """Zoology's recall-memory plot: a mechanism's widths in one cell are one line, in the
  colour `plot_accuracy` gives it; a marker per cell; a row without a decode state is left out."""
  import matplotlib.colors  # pylint: disable=g-import-not-at-top
  import matplotlib.figure  # pylint: disable=g-import-not-at-top

  runs = [
    dict(
      mechanism=m,
      width=w,
      seq_len=n,
      num_kv_pairs=2,
      vocab_size=16,
      learning_rate=lr,
      steps=10,
      seed=0,
      accuracy=0.5,
      train_accuracy=0.5,
      examples_per_sec=1.0,
      params=1,
      state_bytes=w * n * (1 + (m == 'linear')),
      workdir='w',
    )
    for m in ('softmax', 'linear')
    for lr in (1e-2, 3e-3)
    for w, n in ((8, 16), (16, 16), (8, 32))
  ]
  runs.append(dict(runs[0], mechanism='gmlp', state_bytes=None))
  figures = []
  monkeypatch.setattr(
    matplotlib.figure.Figure, 'savefig', lambda fig, path, **kw: figures.append(fig)
  )
  rows = tables.group(runs)
  plots.plot_state(rows, str(tmp_path / 's.png'))
  [ax] = figures[0].axes
  drawn = [bars.lines[0] for bars in ax.containers]  # each errorbar's data line
  # 2 mechanisms x 2 cells x 2 budgets; (16 tokens) joins widths 8 and 16.
  assert sorted(len(line.get_xdata()) for line in drawn) == [1] * 4 + [2] * 4
  assert {matplotlib.colors.to_hex(line.get_color()) for line in drawn} == {
    matplotlib.colors.to_hex(plots.colours(rows)[m]) for m in ('softmax', 'linear')
  }
  assert len({line.get_marker() for line in drawn}) == 2
  assert len({line.get_linestyle() for line in drawn}) == 2
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert labels[:2] == ['linear', 'softmax'] and 'gmlp' not in labels
  assert 'seq_len 16, 2 pairs' in labels and '10 steps, lr 0.003, vocab 16' in labels


def test_error_bars_span_the_seeds_and_never_pass_the_lowest():
  """Three seeds 0.3, 0.0 and 0.9: mean 0.4 ± 0.45 would reach -5%; the bars reach from the
  lowest seed (0%) to the highest (90%)."""
  rows = tables.group(
    [_run('mamba2', s, a) for s, a in ((0, 0.3), (1, 0.0), (2, 0.9))]
    + [_run('softmax', s, a) for s, a in ((0, 0.5), (1, 0.7))]
  )
  bars = {r['mechanism']: plots.seed_range([r])[:, 0] for r in rows}
  np.testing.assert_allclose(bars['mamba2'], [40.0, 50.0])
  np.testing.assert_allclose(bars['softmax'], [10.0, 10.0])  # two seeds: half the range


def test_budget_keeps_the_runs_of_one_budget_and_a_bad_one_is_one_line():
  runs = [_run('softmax', 0, 1.0, steps=s) for s in (10, 20)]
  assert run_records.select(runs, budget=(20, 1e-3, 16)) == runs[1:]
  assert run_records.select(runs, budget=(20, 1e-2, 16)) == []
  assert report.parse_selection([], [], '20,1e-3,16')[2] == (20, 1e-3, 16)
  assert report.parse_selection([], [])[2] is None
  for bad in ('20,1e-3', '20,1e-3,16,1', 'x,1e-3,16', '20,0,16', '0,1e-3,16'):
    with pytest.raises(SystemExit) as e:
      report.parse_selection([], [], bad)
    assert str(e.value).startswith(f'--budget: {bad!r} is not steps,learning_rate,vocab_size')
    assert '\n' not in str(e.value)


def _run(mechanism, seed, accuracy, curve=None, **kw):
  """One run as `read_run` gives it, less its config: a (16, 2) cell at width 8."""
  return dict(
    dict(
      workdir=f'runs/s{seed}/{mechanism}',
      mechanism=mechanism,
      width=8,
      seq_len=16,
      num_kv_pairs=2,
      vocab_size=16,
      seed=seed,
      steps=10,
      learning_rate=1e-3,
      accuracy=accuracy,
      loss=1.0,
      train_accuracy=accuracy,
      examples_per_sec=2.0,
      params=3,
      state_bytes=4,
      curve=curve,
    ),
    **kw,
  )


def test_throughput_names_the_device_unless_a_cpu_and_each_seed_when_they_differ():
  """Examples/s are comparable within a device only: a row run on a GPU says so, a row whose
  seeds ran on different devices gives each seed's, and a run from before results.json named
  its device ('') counts as a CPU's."""
  cpu = [
    _run('linear', s, 0.5, examples_per_sec=e, device=d)
    for s, e, d in ((0, 50.0, 'cpu'), (1, 70.0, ''))
  ]
  gpu = [
    _run('softmax', s, 1.0, examples_per_sec=e, device='NVIDIA H100 80GB HBM3')
    for s, e in ((0, 4000.0), (1, 5000.0))
  ]
  mixed = [
    _run('gla', 0, 0.1, examples_per_sec=57.0),
    _run('gla', 1, 0.1, examples_per_sec=4321.0, device='NVIDIA H100 80GB HBM3'),
  ]
  rows = {r['mechanism']: r for r in tables.group(cpu + gpu + mixed)}
  assert tables.throughput(rows['linear']) == '60'
  assert tables.throughput(rows['softmax']) == '4,500 (H100)'
  assert tables.throughput(rows['gla']) == '57 (cpu), 4,321 (H100)'
  table = tables.markdown(list(rows.values()), 'cmd')
  assert 'examples/s (one CPU core, or the device named)' in table
  assert '| 4,500 (H100) |' in table and '| 57 (cpu), 4,321 (H100) |' in table


def test_a_report_gives_back_its_runs_and_a_new_workdir_replaces_its_own(tmp_path):
  """A report's .json stands in for workdirs that are gone: its `runs` come back as they were
  written, a report with only `rows` (written before `runs` existed) comes back seed by
  seed, and a run read again from its workdir replaces the stored one."""
  stored = [_run('softmax', 0, 0.5, curve=[[50, 100], [0.25, 0.5]]), _run('linear', 0, 0.25)]
  path = tmp_path / 'r.json'
  path.write_text(json.dumps(dict(command='c', rows=tables.group(stored), runs=stored)))
  assert run_records.read_report(str(path)) == stored
  path.write_text(json.dumps(dict(command='c', rows=tables.group(stored))))  # an older report
  assert run_records.read_report(str(path)) == [
    dict(r, curve=None, loss=None) for r in sorted(stored, key=lambda r: -r['accuracy'])
  ]
  again = _run('softmax', 0, 0.75, workdir='new/softmax')
  merged = run_records.merge(stored + [_run('softmax', 1, 1.0)], [again])
  assert sorted((r['mechanism'], r['seed'], r['accuracy']) for r in merged) == [
    ('linear', 0, 0.25),
    ('softmax', 0, 0.75),
    ('softmax', 1, 1.0),
  ]
  [softmax, _] = tables.group(merged)  # best first
  assert softmax['workdirs'] == ['new/softmax', 'runs/s1/softmax']
  assert softmax['mean'] == pytest.approx(0.875)


@pytest.mark.parametrize(
  'text,problem',
  [
    (None, 'no such file'),
    ('{"runs": [', 'it does not parse'),
    ('', 'it cannot be read'),
    ('[1, 2]', 'it has neither'),
    ('{"runs": [{"mechanism": "softmax"}]}', 'it has neither'),
    ('{"rows": [{"mechanism": "softmax"}]}', 'it has neither'),
  ],
)
def test_a_file_that_is_no_report_is_one_line_naming_it(tmp_path, text, problem):
  path = tmp_path / 'bad.json'
  if text == '':
    path.mkdir()  # a folder named .json
  elif text is not None:
    path.write_text(text)
  with pytest.raises(SystemExit) as e:
    run_records.read_report(str(path))
  assert str(e.value).startswith(f'{path}: not a report JSON ({problem}')
  assert '\n' not in str(e.value)


def test_state_is_computed_once_per_model(monkeypatch):
  calls = []
  monkeypatch.setattr(
    decode_state, 'state_bytes', lambda config: calls.append(config) or len(calls)
  )
  runs = [dict(_run(m, s, 0.5), config=f'{m}{s}') for m in ('softmax', 'linear') for s in (0, 1)]
  assert [r['state_bytes'] for r in run_records.with_state(runs)] == [1, 1, 2, 2]
  assert calls == ['softmax0', 'linear0']


def test_curves_draw_the_runs_that_have_one_and_count_the_rest(tmp_path, monkeypatch):
  import matplotlib.colors  # pylint: disable=g-import-not-at-top
  import matplotlib.figure  # pylint: disable=g-import-not-at-top

  figures = []
  monkeypatch.setattr(
    matplotlib.figure.Figure, 'savefig', lambda fig, path, **kw: figures.append(fig)
  )
  curve = [[50, 100], [0.25, 0.5]]
  runs = [
    _run('softmax', 0, 0.5, curve=curve),
    _run('linear', 0, 0.25),
    _run('softmax', 1, 0.5, curve=curve, width=16),
    _run('linear', 0, 0.5, curve=[[50, 100], [0.1, 0.2]], width=16),
  ]
  plots.plot_curves(runs, str(tmp_path / 'c.png'))
  narrow, wide = [ax for ax in figures[0].axes if ax.get_visible()]
  assert 'width 8,' in narrow.get_title() and 'width 16,' in wide.get_title()
  assert [list(line.get_ydata()) for line in narrow.lines] == [[25.0, 50.0]]
  assert [list(line.get_ydata()) for line in wide.lines] == [[10.0, 20.0], [25.0, 50.0]]
  # a colour per mechanism, the same in every panel and in the bar and line plot; a style per seed
  hexes = {m: matplotlib.colors.to_hex(c) for m, c in plots.colours(runs).items()}
  softmax_lines = [narrow.lines[0], wide.lines[1]]
  assert (
    {matplotlib.colors.to_hex(line.get_color()) for line in softmax_lines}
    == {hexes['softmax']}
    != {matplotlib.colors.to_hex(wide.lines[0].get_color())}
  )
  assert [line.get_linestyle() for line in softmax_lines] == ['-', '--']
  [legend] = figures[0].legends
  assert [t.get_text() for t in legend.get_texts()] == ['linear', 'softmax', 'seed 0', 'seed 1']
  assert '1 of 4 runs have no stored curve' in figures[0]._suptitle.get_text()
  plots.plot_curves(runs[1:2], str(tmp_path / 'none.png'))  # no curve: no made-up panel title
  [empty] = figures[1].axes
  assert not empty.lines and empty.get_title() == ''
  assert '1 of 1 runs have no stored curve' in figures[1]._suptitle.get_text()


def test_missing_lists_the_plans_runs_that_the_sources_lack_as_run_sh_takes_them():
  """The plan: the sweep's six and Based's hybrid at every grid width and cell, the other
  causal mechanisms at width 128, (256, 16), two seeds each, at the sweep's budget; a run at
  another budget or with an option off its default is not the plan's run."""
  causal = registry.names_where(lambda m: m.causal)
  plan = study_plan.plan()
  assert len(plan) == 2 * (7 * 4 + len(causal) - 6) == len({run_records.run_key(r) for r in plan})
  assert {(r['vocab_size'], r['learning_rate'], r['steps']) for r in plan} == {(1024, 1e-3, 4000)}
  one_cell = {r['mechanism'] for r in plan if r['width'] == 128 and r['seq_len'] == 256}
  assert {'performer', 'rfa', 'local', 'retention', 'linear', 'deltanet'} <= one_cell
  assert not {'nystrom', 'linformer', 'fnet', 'mixer'} & {r['mechanism'] for r in plan}
  budget = dict(
    width=64, seq_len=128, num_kv_pairs=8, vocab_size=1024, learning_rate=1e-3, steps=4000
  )
  done = [_run('softmax', s, 1.0, **budget) for s in (0, 1)]
  elsewhere = [
    _run('linear', 0, 0.5, **dict(budget, steps=1000)),
    _run('deltanet conv_size=0', 0, 0.5, **budget),
  ]
  lost = study_plan.missing(done + elsewhere)
  assert len(lost) == len(plan) - 2 and len(set(lost)) == len(lost)
  assert '0:softmax:64:128x8' not in lost and '1:softmax:64:128x8' not in lost
  assert '0:linear:64:128x8' in lost and '0:deltanet:64:128x8' in lost
  assert '1:performer:128:256x16' in lost and not any(':performer:64:' in r for r in lost)
  assert all(
    re.fullmatch(r'[01]:[a-z0-9_]+:(64|128):(128x8|256x16)', r)
    for r in lost
    if r.split(':')[1] != 'linear+local'
  )
  based = [r for r in lost if r.split(':')[1] == 'linear+local']
  assert len(based) == 8 and '0:linear+local:64:128x8:feature_map=taylor;qk_dim=16;window=64' in (
    based
  )
  [run] = sweep.expand(
    sweep.load_sweep(  # as run.sh reads the line: the plan's run again
      f'{SWEEP}:seed=0,mechanisms=linear+local,widths=64,cells=128x8,feature_map=taylor,'
      'qk_dim=16,window=64'
    )
  )
  done_based = dict(_run(run_records.label(sweep.build_config(run)), 0, 0.5, **budget))
  assert len(study_plan.missing(done + [done_based])) == len(lost) - 1
  assert study_plan.missing(done, ['softmax'], [64]) == [
    '0:softmax:64:256x16',
    '1:softmax:64:256x16',
  ]


def test_missing_reads_its_sources_and_refuses_another_budget_or_a_source_of_nothing(tmp_path):
  budget = dict(
    width=64, seq_len=128, num_kv_pairs=8, vocab_size=1024, learning_rate=1e-3, steps=4000
  )
  path = tmp_path / 'r.json'
  path.write_text(json.dumps({'runs': [_run('softmax', s, 1.0, **budget) for s in (0, 1)]}))
  header, lost = report.missing_report([str(path)], ['softmax'], [64])
  assert lost == ['0:softmax:64:256x16', '1:softmax:64:256x16']
  assert (
    header.startswith(
      "2 of the plan's 4 runs (vocabulary 1,024, learning rate 0.001, "
      '4,000 steps; seeds 0, 1) are not in '
    )
    and 'run.sh' in header
  )
  assert report.missing_report([str(path)], ['softmax'], [64], (4000, 1e-3, 1024))[1] == lost
  for args, says in (
    (
      ([str(path)], [], [], (2000, 3e-3, 1024)),
      "--budget=2000,0.003,1024 with --missing: the plan is at the sweep's budget; valid: "
      '--budget=4000,0.001,1024 or none',
    ),
    (
      ([str(path), str(tmp_path / 'nothing*')],),
      f"--missing: {tmp_path / 'nothing*'} names no folder; valid sources: ",
    ),
  ):
    with pytest.raises(SystemExit) as e:
      report.missing_report(*args)
    assert str(e.value).startswith(says) and '\n' not in str(e.value)


def test_select_keeps_the_named_mechanisms_and_widths():
  runs = [
    dict(mechanism=m, width=w)
    for m in ('softmax', 'deltanet conv_size=0', 'linear')
    for w in (64, 128)
  ]
  assert run_records.select(runs) == runs
  assert run_records.select(runs, ['deltanet'], [64]) == [
    dict(mechanism='deltanet conv_size=0', width=64)
  ]
  assert [r['mechanism'] for r in run_records.select(runs, ['softmax', 'linear'], [128])] == [
    'softmax',
    'linear',
  ]


@pytest.mark.parametrize(
  'mechanisms,widths,message',
  [
    (['softmax', 'deltanett'], [], "--mechanisms: deltanett not registered; valid choices: "),
    ([], ['64', 'wide'], '--widths: wide is not a positive integer'),
    ([], ['0'], '--widths: 0 is not a positive integer'),
  ],
)
def test_a_bad_selection_is_one_line_naming_it(mechanisms, widths, message):
  with pytest.raises(SystemExit) as e:
    report.parse_selection(mechanisms, widths)
  assert str(e.value).startswith(message) and '\n' not in str(e.value)
  assert report.parse_selection(['softmax'], ['64']) == (['softmax'], [64], None)


def test_gradient_norms_name_each_parameter_and_measure_it():
  params = {'decoder': {'block_0': {'w': jnp.ones((2, 3))}}, 'b': jnp.ones(4)}
  norms = gradients.gradient_norms(
    lambda p: 3.0 * jnp.sum(p['decoder']['block_0']['w']) + 0.0 * jnp.sum(p['b']), params
  )
  assert norms == {'b': 0.0, 'block_0/w': pytest.approx(3 * 6**0.5)}
  key, value = 'block_{}/attention/key/kernel', 'block_{}/attention/value/kernel'
  runs = [
    dict(name='r1', init=norms, final=norms),
    dict(
      name='r2',
      init={
        'b': 1.0,
        key.format(0): 1.0,
        value.format(0): 4.0,
        key.format(10): 3.0,
        value.format(10): 2.0,
        key.format(2): 1.0,
        value.format(2): 0.0,
      },
      final={'b': 2.0, key.format(10): 1.0},
    ),
  ]
  table = gradients.markdown(runs, 'block_0/w|block_0.*key', 'cmd')
  assert (
    f'| run | moment | block_0/w | {key.format(0)} | block_0 key / value | '
    'block_2 key / value | block_10 key / value |'
  ) in table  # every layer, in order
  assert '| r1 | init | 7.35e+00 | - | - | - | - |' in table
  assert '| r2 | init | - | 1.00e+00 | 0.250 | - | 1.500 |' in table  # value 0: no ratio
  assert '| r2 | final | - | - | - | - | - |' in table


@pytest.mark.slow
def test_gradient_probe_reads_a_run_at_its_start_and_its_end(run_once):
  workdir = run_once('mqar', shared_runs.train_tiny_mqar)
  run = gradients.run_norms(workdir)
  key = 'block_0/attention/key/kernel'
  assert run['name'] == 'shared_mqar' and set(run['init']) == set(run['final'])
  assert run['init'][key] > 0 and run['final'][key] > 0 and run['init'][key] != run['final'][key]


@pytest.mark.slow
def test_a_report_of_a_trained_run_reads_back_the_same(run_once, tmp_path):
  """The report of the tiny MQAR run keeps the run, curve and state in its .json, and a
  report made from that .json alone (the workdir gone) has the same rows and runs."""
  workdir = run_once('mqar', shared_runs.train_tiny_mqar)
  shutil.copytree(workdir, tmp_path / 'runs' / 'tiny')
  first = report.write_report([str(tmp_path / 'runs')], str(tmp_path / 'a'), 'cmd')
  [run] = first['runs']
  assert run['seq_len'] == 32 and run['state_bytes'] > 0 and len(run['curve'][0]) == 2
  assert all((tmp_path / f'a{s}').exists() for s in ('.md', '.png', '_state.png', '_curves.png'))
  again = report.write_report([str(tmp_path / 'a.json')], str(tmp_path / 'b'), 'cmd')
  assert again == json.loads((tmp_path / 'a.json').read_text())

"""The benchmark tools run end to end on tiny settings and write valid JSON, markdown, PNG.

Also checks the pieces whose numbers the tools report: loop-corrected FLOPs,
exponent fits, energy curves, identities of the error tool, the parameter counts of
Hosseini & Hosseini (2024).
"""

import io
import json
import os

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest

from benchmarks import approx_error
from benchmarks import approx_error_sweeps
from benchmarks import attention_bench
from benchmarks import common
from benchmarks import cost
from benchmarks import cost_layers
from benchmarks import nnx_overhead
from benchmarks import report
from benchmarks import spectrum
from benchmarks import speed
from benchmarks import speed_measure
from benchmarks import speed_output
from benchmarks import timing
from benchmarks import xla_stats
from efficient_attn.mechanisms.softmax import chunked_softmax_attention
from efficient_attn.mechanisms.softmax import softmax_attention


def check_outputs(out, name, pngs):
  """<out>/<name>.json parses, <name>.md holds well-formed tables, the PNGs decode."""
  with open(os.path.join(out, f'{name}.json')) as f:
    data = json.load(f)
  with open(os.path.join(out, f'{name}.md')) as f:
    text = f.read()
  assert text.startswith('# ') and 'cpu' in text.splitlines()[2]
  lines = text.splitlines()
  tables = 0
  for i, line in enumerate(lines):
    if line.startswith('|:') or line.startswith('|-'):
      tables += 1
      width = lines[i - 1].count(' | ')
      j = i + 1
      while j < len(lines) and lines[j].startswith('|'):
        assert lines[j].count(' | ') == width, lines[j]
        j += 1
  assert tables >= 1
  for png in pngs:
    path = os.path.join(out, png)
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
  return data, text


# ----------------------------------------------------------------------------
# Pieces.
# ----------------------------------------------------------------------------


def test_loop_corrected_flops_match_the_unchunked_count():
  q = jax.ShapeDtypeStruct((1, 256, 2, 16), jnp.float32)
  full = jax.jit(softmax_attention).lower(q, q, q).compile()
  chunked = (
    jax.jit(lambda q, k, v: chunked_softmax_attention(q, k, v, q_chunk=64, k_chunk=32))
    .lower(q, q, q)
    .compile()
  )
  f_full, f_chunk = xla_stats.flops(full), xla_stats.flops(chunked)
  assert f_full['loops'] == 0 and f_full['flops'] == f_full['flops_xla']
  assert f_chunk['loops'] >= 2 and f_chunk['unknown_trip_counts'] == 0
  assert f_chunk['flops_xla'] < 0.2 * f_full['flops']  # XLA counts each body once
  assert abs(f_chunk['flops'] / f_full['flops'] - 1) < 0.1  # the correction restores it
  mem = xla_stats.memory(full)
  assert mem['total'] >= mem['argument'] > 0


CALLS_HLO = """HloModule m

%inner (a: f32[4,8], b: f32[8,2]) -> f32[4,2] {
  %a = f32[4,8]{1,0} parameter(0)
  %b = f32[8,2]{1,0} parameter(1)
  ROOT %d = f32[4,2]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%yes (p: f32[4,8]) -> f32[4,2] {
  ROOT %f = f32[4,2]{1,0} fusion(%p, %w), kind=kLoop, calls=%inner
}

ENTRY %main (x: f32[4,8]) -> f32[4,2] {
  %w = (s32[], f32[4,8]{1,0}) while(%init), condition=%cond, body=%yes, metadata={op_name="scan"}, backend_config={"known_trip_count":{"n":"3"}}
  %c = f32[4,2]{1,0} conditional(%i, %x, %x), branch_computations={%yes, %inner}
  ROOT %r = f32[] reduce(%c, %z), dimensions={0,1}, to_apply=%add
}
"""


def test_hlo_calls_read_single_and_listed_callees_and_loop_counts():
  comps, entry = xla_stats.computations(CALLS_HLO)
  assert entry == 'main' and set(comps) == {'inner', 'yes', 'main'}
  lines = comps['main'][1]
  # A name after `body=` stops at the comma: `metadata` is not a callee.
  assert xla_stats.calls(lines[0]) == [('body', 'yes', 3)]
  assert xla_stats.calls(lines[1]) == [
    ('branch_computations', 'yes', 1),
    ('branch_computations', 'inner', 1),
  ]
  assert xla_stats.calls(lines[2]) == [] and xla_stats.calls(lines[2], ('to_apply',)) == [
    ('to_apply', 'add', 1)
  ]
  graph = {n: [c for line in ls for c in xla_stats.calls(line)] for n, (_, ls) in comps.items()}
  # inner: once per loop iteration (3) through `yes`, once per branch of the conditional
  # through `yes` and directly (every branch counts).
  assert xla_stats.call_counts(graph, 'main') == {'main': 1, 'yes': 4, 'inner': 5}
  assert xla_stats.call_counts(graph, 'main', loops=False)['inner'] == 3
  # Dot FLOPs: the loop and the fusion only (branches are not followed by loop_flops).
  once, repeated, loops, unknown = xla_stats.loop_flops(CALLS_HLO)
  assert (once, repeated, loops, unknown) == (2 * 4 * 2 * 8, 3 * 2 * 4 * 2 * 8, 1, 0)


def test_exponent_fit_and_time_prediction():
  ns = [256, 512, 1024, 2048]
  assert timing.fit_exponent(ns, [3 * n**1.5 for n in ns]) == pytest.approx(1.5)
  assert timing.fit_exponent(ns, [n**2 for n in ns], lo=1024) == pytest.approx(2.0)
  assert timing.fit_exponent(ns, [1.0, None, None, None]) is None
  assert timing.predict_time([100], [1.0], 200) == pytest.approx(4.0)
  assert timing.predict_time([100, 200], [1.0, 2.0], 400) == pytest.approx(4.0)


def test_energy_curve_and_rank():
  assert spectrum.rank_for(spectrum.energy_curve(np.ones(10)), 0.9) == 9
  assert spectrum.rank_for(spectrum.energy_curve(np.array([1.0, 0, 0, 0])), 0.9) == 1
  # Uniform attention is rank one: one singular value carries all the energy.
  q = jnp.zeros((1, 12, 2, 4))
  curves = spectrum.attention_spectra(q, q)
  assert curves.shape == (1, 2, 12) and np.allclose(curves, 1.0)
  # Padding: a 5-token example uses its 5 x 5 block.
  qr = jax.random.normal(jax.random.PRNGKey(0), (1, 8, 1, 4))
  pad = np.array([[True] * 5 + [False] * 3])
  curves = spectrum.attention_spectra(qr, qr, pad)
  assert np.allclose(curves[0, 0, 4:], 1.0) and np.all(np.diff(curves[0, 0]) >= -1e-12)


# ----------------------------------------------------------------------------
# The tools, end to end.
# ----------------------------------------------------------------------------


UNKNOWN = "Unknown attention mechanism 'nystrm'; valid mechanisms: softmax, "
NOT_INT = "'abc' is not valid: 'abc' is not an integer; valid: a comma list of integers"


def test_emit_drops_the_rest_quietly_once_the_reader_closes_the_pipe(tmp_path):
  class Closed(io.StringIO):  # `... | head -1`: head has gone
    def write(self, text):
      raise BrokenPipeError(32, 'Broken pipe')

  with open(tmp_path / 'sink', 'w') as sink:
    stream = Closed()
    stream.fileno = sink.fileno
    common.emit('0:softmax:64:256x16', stream)  # no BrokenPipeError
    os.write(sink.fileno(), b'the exit flush')  # goes to os.devnull now
  assert (tmp_path / 'sink').read_text() == ''
  out = io.StringIO()
  common.emit('0:softmax:64:256x16', out)
  assert out.getvalue() == '0:softmax:64:256x16\n'


@pytest.mark.parametrize(
  'tool,flags,message',
  [
    (speed, ['--targets=nystrm'], f'Error: --targets / --layers: {UNKNOWN}'),
    (speed, ['--targets=linear', '--lengths=abc'], f'Error: --lengths={NOT_INT}'),
    (
      speed,
      ['--targets=linear', '--lengths=8', '--extra_lengths=linear=abc'],
      f'Error: --extra_lengths of linear={NOT_INT}',
    ),
    (
      speed,
      ['--targets=linear', '--lengths=8', '--extra_lengths=lineer=16'],
      "Error: --extra_lengths='lineer=16': 'lineer' is not one of the targets",
    ),
    (
      speed,
      ['--targets=linear', '--lengths=8', '--option=nystrom.bogus=1'],
      "Error: --option: unknown option(s) ['bogus'] for mechanism 'nystrom'",
    ),
    (
      speed,
      ['--targets=gla@bogus=1', '--lengths=8'],
      "Error: --targets / --layers: unknown option(s) ['bogus'] for mechanism 'gla'",
    ),
    (
      speed,
      ['--targets=linear,gla', '--lengths=8', '--compare=gla:retention'],
      "Error: --compare='gla:retention' is not valid; it must be a:b, two of the targets",
    ),
    (approx_error, ['--mechanisms=nystrm'], f'Error: --mechanisms: {UNKNOWN}'),
    (approx_error, ['--lengths=abc'], f'Error: --lengths={NOT_INT}'),
    (
      approx_error,
      ['--mechanisms=linear', '--knob=nystrom.num_landmarks=4'],
      "Error: --knob 'nystrom.num_landmarks=4': 'nystrom' is not one of the mechanisms",
    ),
    (
      spectrum,
      ['--source=random:softmax', '--source=/nonexistent/run'],
      "Error: no such workdir '/nonexistent/run'",
    ),
    (
      cost,
      ['--d_model=30', '--heads=8'],
      'Error: --heads=8 does not divide --d_model=30; valid --heads: 1, 2, 3, 5, 6, 10, 15, 30',
    ),
    (cost, ['--lengths=abc'], f'Error: --lengths={NOT_INT}'),
  ],
)
def test_bad_flag_values_stop_in_one_line_before_any_work(tool, flags, message, tmp_path):
  """Each was a traceback (or, for cost, exit 0 with a table of ValueError rows; for
  approx_error's --lengths, after the knob sweep; for a second spectrum source, after the
  first was analysed)."""
  out = tmp_path / 'out'
  with pytest.raises(SystemExit) as e:
    tool.main([f'--out={out}', '--quiet', *flags])
  assert str(e.value).startswith(message) and '\n' not in str(e.value), str(e.value)
  assert not out.exists()


@pytest.mark.slow
def test_speed_tool(tmp_path):
  out = str(tmp_path)
  data = speed.main(
    [
      f'--out={out}',
      '--targets=exact,softmax_chunked',
      '--layers=linear/efficient',
      '--lengths=32',
      '--heads=2',
      '--head_dim=8',
      '--repeats=1',
      '--option=softmax_chunked.k_chunk=16',
      '--extra_lengths=softmax_chunked=64',
      '--quiet',
    ]
  )
  _, text = check_outputs(out, 'speed', ['speed_time.png', 'speed_memory.png', 'speed_speedup.png'])
  points = data['points']
  assert len(points) == 3 * 2 + 2  # targets x modes, + the extra length of softmax_chunked
  assert all(p['status'] == 'ok' and p['time_s'] > 0 and p['memory_bytes'] > 0 for p in points)
  assert {p['memory_source'] for p in points} == {'xla'}
  assert data['meta']['options']['softmax_chunked']['k_chunk'] == 16
  summary = data['summary']
  assert summary['exact:fwd']['speedup_vs_exact'][32] == pytest.approx(1.0)
  assert summary['softmax_chunked:fwd_bwd']['speedup_vs_exact'][32] > 0
  assert 64 not in summary['softmax_chunked:fwd']['speedup_vs_exact']  # no exact at 64
  assert '## forward + backward: time per call' in text and 'linear/efficient' in text


def test_speed_targets_with_options_interleaved_and_compared(tmp_path):
  """'mechanism@option=value' targets run with their own options; --order=length measures
  every target at one length before the next; --compare reports time(a) / time(b); the
  header says which targets ran causal because they are causal only (it said 'non-causal')."""
  out = str(tmp_path)
  data = speed.main(
    [
      f'--out={out}',
      '--targets=linear,retention@form=naive',
      '--layers=',
      '--lengths=8,16',
      '--heads=1',
      '--head_dim=4',
      '--modes=fwd',
      '--repeats=1',
      '--order=length',
      '--compare=retention@form=naive:linear',
      '--quiet',
    ]
  )
  points = data['points']
  assert [(p['target'], p['length']) for p in points] == [
    ('linear', 8),
    ('retention@form=naive', 8),
    ('linear', 16),
    ('retention@form=naive', 16),
  ]
  ratios = data['ratios']['retention@form=naive:linear:fwd']
  for n in (8, 16):
    assert ratios[n] == pytest.approx(
      points[2 * (n // 16) + 1]['time_s'] / points[2 * (n // 16)]['time_s']
    )
  text = open(os.path.join(out, 'speed.md')).read()
  assert 'non-causal, except the causal-only retention@form=naive (causal)' in text
  assert '| retention@form=naive / linear |' in text
  assert 'speedup vs exact' not in text  # no 'exact' target: no table of empty cells
  assert '| exponent' not in text  # lengths 8, 16 lie outside --fit_range: nothing fitted


def test_speed_exponent_column_names_the_lengths_fitted():
  """The header says the range fitted (it said --fit_range's, 1024-16384, whatever ran); a
  row fitted over fewer lengths says its own."""
  full = dict(time_exponent=2.0, memory_exponent=None, fit_lengths=[1024, 2048, 4096])
  part = dict(time_exponent=1.0, memory_exponent=None, fit_lengths=[1024, 2048])
  assert speed_output.exponent_column([full, part], 'time') == (
    'exponent 1024-4096',
    ['2', '1 (1024-2048)'],
  )
  assert speed_output.exponent_column([full, part], 'memory') is None


def test_speed_records_skipped_and_failed_points(tmp_path):
  out = str(tmp_path)
  data = speed.main(
    [
      f'--out={out}',
      '--targets=exact',
      '--layers=softmax/super',
      '--lengths=16,32',
      '--heads=1',
      '--head_dim=4',
      '--modes=fwd',
      '--memory_budget_gb=1e-7',
      '--quiet',
    ]
  )
  by_len = {(p['target'], p['length']): p for p in data['points']}
  assert by_len[('exact', 16)]['status'] == 'skipped'
  assert 'budget' in by_len[('exact', 16)]['reason']
  assert 'already over budget' in by_len[('exact', 32)]['reason']
  assert by_len[('softmax/super', 16)]['status'] == 'skipped'
  _, text = check_outputs(out, 'speed', ['speed_time.png'])
  assert '## Points not measured' in text
  # A point that raises is recorded, not fatal.
  bad = speed_measure.safe_measure(
    dict(
      target='linformer',
      mode='fwd',
      length=8,
      batch=1,
      heads=1,
      head_dim=4,
      dtype='float32',
      causal=True,
      options={},
      repeats=1,
      time_budget_s=1.0,
      memory_budget_bytes=None,
      seed=0,
      exact_implementation=None,
    )
  )
  assert bad['status'] == 'failed' and 'causal' in bad['reason']


def test_speed_isolated_point_reports_peak_rss():
  spec = dict(
    target='softmax_chunked',
    mode='fwd_bwd',
    length=32,
    batch=1,
    heads=1,
    head_dim=4,
    dtype='float32',
    causal=False,
    options={'k_chunk': 8},
    repeats=1,
    time_budget_s=5.0,
    memory_budget_bytes=None,
    seed=0,
    exact_implementation=None,
  )
  rec = speed_measure.run_isolated(spec, timeout_s=300)
  assert rec['status'] == 'ok', rec
  assert rec['rss_peak_bytes'] >= rec['rss_baseline_bytes'] > 0
  assert speed_measure.headline_memory(rec, True, 'cpu') == (rec['rss_peak_bytes'], 'rss')


@pytest.mark.slow
def test_approx_error_tool_and_identities(tmp_path):
  out = str(tmp_path)
  data = approx_error.main(
    [
      f'--out={out}',
      '--mechanisms=softmax_chunked,nystrom,local,linformer',
      '--knob=nystrom.num_landmarks=4,n',
      '--knob=local.window=2n',
      '--knob=linformer.k_proj=8',
      '--knob=softmax_chunked.k_chunk=16',
      '--knob_length=16',
      '--lengths=16',
      '--scales=0.5',
      '--seeds=1',
      '--heads=1',
      '--head_dim=8',
      '--quiet',
    ]
  )
  check_outputs(
    out,
    'approx_error',
    ['approx_error_knob.png', 'approx_error_length.png', 'approx_error_scale.png'],
  )
  knob = {(r['mechanism'], r['resolved']): r['error'] for r in data['knob']}
  assert knob[('nystrom', 16)] < knob[('nystrom', 4)]
  assert knob[('local', 32)] < 1e-5  # the window covers every key
  assert knob[('softmax_chunked', 16)] < 1e-5
  assert len(data['length']) == len(data['scale']) == 4
  identities = {r['mechanism']: r['error'] for r in data['identity']}
  # the mechanisms that declare exact settings (linformer declares none)
  assert set(identities) == {'softmax_chunked', 'nystrom', 'local'}
  for mechanism, err in identities.items():
    assert err < 1e-4, (mechanism, err)


def test_knob_values_depend_on_the_length():
  assert approx_error_sweeps.knob_values('num_landmarks', [4, 8, 32, 'n'], 16) == [4, 8, 'n']
  assert approx_error_sweeps.knob_values('num_features', [8, 64], 16) == [8, 64]
  assert approx_error_sweeps.knob_values('window', [16, 32, 64, '2n'], 16) == [16, 32]


def test_rfa_is_compared_with_softmax_over_cosine_similarities():
  q, k, v = attention_bench.random_qkv(0, 1, 16, 1, 8)
  ref = approx_error_sweeps.reference('rfa', {'sigma': 1.0}, q, k, v)
  unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
  assert np.allclose(ref, softmax_attention(unit(q), unit(k), v, scale=1.0), atol=1e-5)
  mean, _ = approx_error_sweeps.point_error('rfa', {'num_features': 256}, [(0, (q, k, v))])
  assert mean < 0.1


def test_cost_tool_reproduces_the_papers_parameter_counts(tmp_path):
  out = str(tmp_path)
  data = cost.main(
    [
      f'--out={out}',
      '--mechanisms=softmax,softmax_chunked',
      '--projections=standard',
      '--d_model=16',
      '--heads=2',
      '--length=32',
      '--lengths=16,64',
      '--option=softmax_chunked.k_chunk=8',
      '--option=softmax_chunked.q_chunk=8',
      '--quiet',
    ]
  )
  check_outputs(out, 'cost', ['cost_flops.png', 'cost_params.png'])
  assert data['paper_params'] and all(r['match'] for r in data['paper_params'])
  layers = {(r['mechanism'], r['projection']): r for r in data['layers']}
  d, l = 16, 32
  assert layers[('softmax', 'standard')]['params_total'] == 4 * (d * d + d)
  sup = cost_layers.layer_cost(
    'softmax', 'super', d_model=d, heads=2, length=l, batch=1, options={}, modes=()
  )
  assert sup['params_total'] == 2 * (d * d + d) + l * l + l
  exact, chunked = layers[('softmax', 'standard')], layers[('softmax_chunked', 'standard')]
  assert chunked['fwd_loops'] > 0
  assert abs(chunked['fwd_flops'] / exact['fwd_flops'] - 1) < 0.15
  assert data['meta']['scaling']['softmax']['flops_exponent'] > 1.2
  linformer = cost_layers.layer_cost(
    'linformer', 'efficient', d_model=d, heads=2, length=l, batch=1, options={'k_proj': 8}, modes=()
  )
  assert linformer['params_mechanism'] == 2 * 8 * l  # E, F: k x n
  assert linformer['params_total'] == 2 * (d * d + d) + 2 * 8 * l


def test_spectrum_tool(tmp_path):
  out = str(tmp_path)
  data = spectrum.main(
    [f'--out={out}', '--source=random:softmax', '--num_examples=2', '--ks=4,8', '--quiet']
  )
  check_outputs(out, 'spectrum', ['spectrum_energy.png', 'spectrum_rank.png'])
  layers = data['results'][0]['layers']
  assert len(layers) == 2
  for layer in layers:
    curve = np.asarray(layer['mean_curve'])
    assert curve.shape == (17,) and np.all(np.diff(curve) >= -1e-9)
    assert curve[-1] == pytest.approx(1.0)
    assert 1 <= layer['rank_min'] <= layer['rank_mean'] <= layer['rank_max'] <= 17


def write_fake_run(
  root, name, mechanism, finished=True, seed=0, eval_accuracy=0.6, epoch_time_s=3.0
):
  wd = os.path.join(root, name)
  os.makedirs(wd)
  with open(os.path.join(wd, 'config.json'), 'w') as f:
    json.dump(
      dict(
        dataset=dict(name='digits'),
        model=dict(num_heads=2, d_model=16),
        attention=dict(mechanism=mechanism, projection='standard'),
        train=dict(seed=seed, num_steps=20),
      ),
      f,
    )
  with open(os.path.join(wd, 'metrics.jsonl'), 'w') as f:
    for step in (10, 20):
      f.write(
        json.dumps(
          dict(
            step=step,
            split='train',
            loss=2.0 / step,
            accuracy=0.04 * step,
            examples_per_sec=100.0,
            epoch_time_s=3.0,
          )
        )
        + '\n'
      )
      f.write(
        json.dumps(dict(step=step, split='eval', loss=2.5 / step, accuracy=0.03 * step)) + '\n'
      )
    f.write('{"step": 30, "spl')  # a torn last line of a run still writing
  if finished:
    with open(os.path.join(wd, 'results.json'), 'w') as f:
      json.dump(
        dict(
          train_loss=0.1,
          train_accuracy=0.8,
          eval_loss=0.125,
          eval_accuracy=eval_accuracy,
          test_top5_accuracy=0.9,
          params_total=1234,
          params_per_attention_layer=272,
          examples_per_sec=100.0,
          epoch_time_s=epoch_time_s,
          steps=20,
          dataset='digits',
          mechanism=mechanism,
          projection='standard',
          heads=2,
          d_model=16,
        ),
        f,
      )
  return wd


def test_report_tool(tmp_path):
  runs_root = str(tmp_path / 'runs')
  done = write_fake_run(runs_root, 'a_softmax', 'softmax')
  going = write_fake_run(runs_root, 'b_linear', 'linear', finished=False)
  os.makedirs(os.path.join(runs_root, 'not_a_run'))
  out = str(tmp_path / 'out')
  data = report.main(
    [
      done,
      going,
      os.path.join(runs_root, 'not_a_run'),
      f'--out={out}',
      '--sort=eval_accuracy',
      '--quiet',
    ]
  )
  _, text = check_outputs(out, 'report', ['report_curves.png'])
  rows = {r['run']: r for r in data['runs']}
  assert set(rows) == {'a_softmax', 'b_linear'}
  assert rows['a_softmax']['status'] == 'finished' and rows['a_softmax']['eval_accuracy'] == 0.6
  assert rows['b_linear']['status'] == 'running' and rows['b_linear']['steps'] == 20
  assert rows['b_linear']['eval_accuracy'] == pytest.approx(0.6)  # last eval: 0.03 * 20
  assert '| a_softmax | digits | softmax | standard | 2 | 16 | 0 | 1,234 | 272 | 80.00%' in text
  assert data['seed_groups'] == [] and 'Over seeds' not in text  # one seed of each


def test_report_zooms_on_late_eval_accuracy(tmp_path, monkeypatch):
  """The third panel shows eval accuracy over each run's second half, its y-axis fitted to
  those values, so 97% against 98% is not squeezed into a 0-1 axis."""
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  figures = []
  monkeypatch.setattr(report.output, 'save_figure', lambda fig, path: figures.append(fig) or path)
  root = str(tmp_path / 'runs')
  dirs = [write_fake_run(root, name, name) for name in ('softmax', 'linear')]
  report.main(dirs + [f'--out={tmp_path / "out"}', '--quiet'])
  (fig,) = figures
  zoom = fig.axes[2]
  lines = zoom.get_lines()
  assert len(lines) == 2 and all(list(l.get_xdata()) == [20] for l in lines)  # not step 10
  low, high = zoom.get_ylim()
  assert 0.59 < low < 0.6 < high < 0.61  # eval accuracy 0.6 at step 20, not 0.3 at step 10
  plt.close(fig)


def test_report_over_seeds(tmp_path):
  """Runs whose configs differ only in train.seed are summarised: mean, half-range spread,
  extremes; a running run, or one of another config, joins no group."""
  root = str(tmp_path / 'runs')
  dirs = [
    write_fake_run(
      os.path.join(root, f's{seed}'),
      'softmax',
      'softmax',
      seed=seed,
      eval_accuracy=acc,
      epoch_time_s=t,
    )
    for seed, acc, t in ((0, 0.97, 2.0), (1, 0.98, 4.0), (2, 0.96, 3.0))
  ]
  dirs.append(
    write_fake_run(os.path.join(root, 's3'), 'softmax', 'softmax', seed=3, finished=False)
  )
  dirs.append(write_fake_run(os.path.join(root, 's0'), 'linear', 'linear', seed=0))
  out = str(tmp_path / 'out')
  data = report.main(dirs + [f'--out={out}', '--quiet'])
  (group,) = data['seed_groups']
  assert group['runs'] == ['softmax'] and group['seeds'] == [0, 1, 2] and group['n'] == 3
  assert group['eval_accuracy_mean'] == pytest.approx(0.97)
  assert group['eval_accuracy_spread'] == pytest.approx(0.01)
  assert (group['eval_accuracy_min'], group['eval_accuracy_max']) == (0.96, 0.98)
  assert group['epoch_time_s_mean'] == pytest.approx(3.0)
  text = (tmp_path / 'out' / 'report.md').read_text()
  assert (
    '| softmax | softmax | standard | 0, 1, 2 | 97.00% | ±1.00 | 96.00% | 98.00% | 3 s |' in text
  )
  ids = {r['run']: r['config_id'] for r in data['runs']}
  assert len(set(ids.values())) == 2 and ids['softmax'] != ids['linear']  # seed left out


def test_report_reads_an_earlier_report_for_lost_workdirs(tmp_path):
  """A report's JSON stands in for workdirs that are gone, and its rows join the seed
  groups: by config_id; by what every row records when the report predates config_id,
  and the table says so. A file that is no report stops with one line naming it."""
  root = str(tmp_path / 'runs')
  seed0 = [
    write_fake_run(os.path.join(root, 's0'), m, m, seed=0, eval_accuracy=0.9)
    for m in ('softmax', 'linear')
  ]
  report.main(seed0 + [f'--out={tmp_path}', '--name=seed0', '--quiet'])
  seed1 = write_fake_run(os.path.join(root, 's1'), 'softmax', 'softmax', seed=1, eval_accuracy=0.8)
  old = str(tmp_path / 'seed0.json')
  data = report.main([old, seed1, f'--out={tmp_path}', '--name=both', '--quiet'])
  assert [r.get('source') for r in data['runs']] == [old, old, None]
  (group,) = data['seed_groups']
  assert data['seed_groups_by'] == 'config' and group['seeds'] == [0, 1]
  assert group['eval_accuracy_mean'] == pytest.approx(0.85)

  with open(old) as f:
    legacy = json.load(f)
  for r in legacy['runs']:
    del r['config_id']
  with open(old, 'w') as f:
    json.dump(legacy, f)
  data = report.main([old, seed1, f'--out={tmp_path}', '--name=legacy', '--quiet'])
  (group,) = data['seed_groups']
  assert group['seeds'] == [0, 1] and data['seed_groups_by'].startswith('model, dataset')
  assert 'predates config_id' in (tmp_path / 'legacy.md').read_text()

  for name, text in (
    ('other.json', '[1, 2]'),
    ('rows.json', '{"runs": [{"step": 1}]}'),
    ('torn.json', '{"runs": ['),
  ):
    (tmp_path / name).write_text(text)
    with pytest.raises(SystemExit, match=f'{name}: not a report JSON'):
      report.main([str(tmp_path / name), f'--out={tmp_path}', '--name=bad', '--quiet'])
  assert not (tmp_path / 'bad.md').exists()


@pytest.mark.slow
def test_tools_on_a_tiny_trained_run(tmp_path):
  """Trains digits for a few steps with the real trainer, then analyses the workdir."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from train import trainer  # pylint: disable=g-import-not-at-top

  config = default.get_config()
  config.model.update(dict(d_model=16, num_heads=2, mlp_dim=32, depth=1))
  config.train.update(
    dict(num_steps=2, num_epochs=-1, eval_every=2, log_every=1, checkpoint_every=2)
  )
  workdir = str(tmp_path / 'digits')
  results = trainer.train_and_evaluate(config, workdir)
  assert results is not None
  out = str(tmp_path / 'out')
  rep = report.main([workdir, f'--out={out}', '--quiet'])
  assert rep['runs'][0]['status'] == 'finished'
  assert rep['runs'][0]['params_per_attention_layer'] == 4 * (16 * 16 + 16)
  spec = spectrum.main([f'--out={out}', f'--source={workdir}', '--num_examples=3', '--quiet'])
  assert spec['results'][0]['info']['dataset'] == 'digits'
  assert spec['results'][0]['layers'][0]['length'] == 17
  err = approx_error.main(
    [
      f'--out={out}',
      '--mechanisms=nystrom',
      '--knob_length=8',
      '--knob=nystrom.num_landmarks=4,n',
      '--lengths=',
      '--scales=',
      '--seeds=1',
      '--heads=1',
      '--head_dim=4',
      f'--source={workdir}',
      '--num_examples=3',
      '--no_identities',
      '--quiet',
    ]
  )
  captured = [r for r in err['knob'] if 'captured' in r['inputs']]
  assert [r['resolved'] for r in captured] == [4, 17]
  assert set(captured[0]['per_layer']) == {'encoder/block_0/attention'}
  check_outputs(out, 'approx_error', ['approx_error_checkpoint.png'])


def test_nnx_overhead_tool(tmp_path):
  nnx_overhead.main(
    [
      '--mechanisms=linear,softmax',
      '--batch=2',
      '--length=8',
      '--d_model=16',
      '--heads=2',
      '--repeats=2',
      f'--out={tmp_path}',
      '--name=o',
    ]
  )
  data = json.loads((tmp_path / 'o.json').read_text())
  linear, softmax = data['rows']
  assert linear['mechanism'] == 'linear' and linear['linen_s'] > 0 and linear['nnx_s'] > 0
  assert linear['flax_s'] is None and softmax['flax_s'] > 0  # flax's layer: softmax only
  assert '| linear |' in (tmp_path / 'o.md').read_text()


def test_counts_read_without_exponents():
  """A rate below 10^4 is never written in e-notation (6610.3 was '6.61e+03')."""
  from benchmarks import output  # pylint: disable=g-import-not-at-top

  cases = {12_345_678: '12.3M', 12_700.4: '12.7K', 6_610.3: '6,610', 9_999: '9,999', 2.345: '2.35'}
  for value, text in cases.items():
    assert output.fmt_count(value) == text, value
  assert output.fmt_count(float('nan')) is None and output.fmt_count(None) is None

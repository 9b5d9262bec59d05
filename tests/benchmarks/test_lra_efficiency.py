"""benchmarks.lra_efficiency: one tiny run (two mechanisms, two short lengths)."""

import json

import pytest

from benchmarks import lra_efficiency


@pytest.mark.slow
def test_steps_and_memory_relative_to_softmax(tmp_path):
  data = lra_efficiency.main(
    [
      '--mechanisms=linear,synthesizer',
      '--lengths=32',
      '--batch_size=2',
      '--steps=1',
      '--size=small',
      f'--out={tmp_path}',
      '--quiet',
    ]
  )
  assert data['mechanisms'] == ['softmax', 'linear', 'synthesizer']  # softmax added first
  # No causal-only mechanism, no such note; the default clock is the wall's.
  assert not [n for n in data['meta']['notes'] if 'causal only' in n]
  assert 'time: elapsed (wall) time.' in data['meta']['notes']
  for n in (32,):
    assert data['relative_speed']['softmax'][n] == 1.0
    assert data['relative_memory']['softmax'][n] == 1.0
    linear = data['points']['linear'][n]
    assert linear['steps_per_s'] > 0 and linear['memory_bytes'] > 0
    assert data['relative_speed']['linear'][n] == (
      linear['steps_per_s'] / data['points']['softmax'][n]['steps_per_s']
    )
  saved = json.loads((tmp_path / 'lra_efficiency.json').read_text())
  assert saved['meta']['batch_size'] == 2
  text = (tmp_path / 'lra_efficiency.md').read_text()
  assert '| linear |' in text and 'relative to softmax' in text
  assert (tmp_path / 'lra_efficiency.png').exists()
  # LRA's Table 2 beside ours: the printed speed-ups, memory relative to the printed 9.48 GB.
  assert '## Published (LRA, not measured here)' in text
  assert '| linear | Linear Trans. | 1.1x | 1.9x | 3.7x | 5.6x |' in text
  assert '| linear | Linear Trans. | 0.44x | 0.22x | 0.15x | 0.11x |' in text
  assert 'sparse' not in saved['published']['models']  # not in LRA's Table 2
  assert saved['published']['models']['softmax']['memory_gb'][3] == 9.48


@pytest.mark.slow
def test_an_interrupted_run_resumes(tmp_path):
  """Points measured before an interruption (the .partial.json) are kept, not measured
  again; a partial file of another setting is ignored; the finished run removes it."""
  partial = tmp_path / 'lra_efficiency.partial.json'
  args = [
    '--mechanisms=linear',
    '--lengths=32',
    '--batch_size=2',
    '--steps=1',
    '--size=small',
    f'--out={tmp_path}',
    '--quiet',
    '--memory_budget_gb=8',
  ]
  setting = dict(size='small', batch_size=2, steps=1, budget=8 * 2**30, clock='wall')
  kept = {'steps_per_s': 123.0, 'step_s': 1 / 123.0, 'memory_bytes': 1000, 'params': 1}
  partial.write_text(json.dumps(dict(setting=setting, points={'softmax': {'32': kept}})))
  data = lra_efficiency.main(args)
  assert data['points']['softmax'][32] == kept  # not measured again
  assert data['points']['linear'][32]['steps_per_s'] != 123.0
  assert not partial.exists()
  partial.write_text(
    json.dumps(dict(setting=dict(setting, steps=5), points={'softmax': {'32': kept}}))
  )
  data = lra_efficiency.main(args)
  assert data['points']['softmax'][32]['steps_per_s'] != 123.0  # another setting: measured


@pytest.mark.slow
def test_a_causal_only_mechanism_runs_causal_and_the_notes_say_so(tmp_path):
  """The gated recurrences are causal only: the trainer builds them causal inside LRA's
  bidirectional encoder, and the table's notes name them (no silent change of pattern)."""
  args = [
    '--mechanisms=gla',
    '--lengths=32',
    '--batch_size=2',
    '--steps=1',
    '--size=small',
    f'--out={tmp_path}',
    '--quiet',
  ]
  data = lra_efficiency.main(args + ['--clock=process'])
  assert data['points']['gla'][32]['steps_per_s'] > 0
  assert "time: the process's CPU time" in (tmp_path / 'lra_efficiency.md').read_text()
  notes = [n for n in data['meta']['notes'] if 'causal only' in n]
  assert notes and notes[0].startswith('gla: causal only, so run in their causal form')
  assert notes[0] in (tmp_path / 'lra_efficiency.md').read_text()
  # Without a causal-only mechanism there is no such note: test_steps_and_memory_... checks it.

"""benchmarks.lra_memory: one tiny split of the LRA Text model's training memory."""

import pytest

from benchmarks import lra_memory


@pytest.mark.slow
def test_the_split_adds_up(tmp_path):
  data = lra_memory.main(
    ['--mechanisms=softmax,linear', '--length=32', '--size=small', f'--out={tmp_path}', '--quiet']
  )
  softmax, linear = data['rows']
  for r in (softmax, linear):
    assert r['depth'] == 2 and 0 < r['state'] < r['step'] and 0 < r['fixed'] < r['step']
    assert r['fixed'] + r['depth'] * r['per_layer'] == pytest.approx(r['step'])
    assert r['floor'] == pytest.approx(r['step'] - r['depth'] * r['attention'])
    assert 0 < r['attention_share'] < 1
  text = (tmp_path / 'lra_memory.md').read_text()
  assert '| linear |' in text and 'vs softmax' in text and 'command: python -m' in text

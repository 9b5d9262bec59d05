"""`benchmarks.packing`: the layouts it times, and a tiny run's JSON and table."""

import json
import os

import numpy as np
import pytest

from benchmarks import packing
from data import packing as packing_lib
from efficient_attn import registry

L = 16
DOCS = [b'A first document, long enough for three windows of bytes.', b'Short.', b'x'] + [
  f'Document number {i} here.'.encode() for i in range(6)
]


def test_the_layouts_hold_the_same_windows_padded_packed_and_full():
  rows = packing.layouts(DOCS, L)
  padded, packed, full = rows['padded'], rows['packed'], rows['full']
  real = lambda r: int((r['labels'] >= 0).sum())
  assert real(padded) == real(packed) == sum(len(d) for d in DOCS)
  assert len(packed['inputs']) < len(padded['inputs'])
  # padded: one window a row, segment 1 over its bytes, 0 after
  assert ((padded['segment_ids'] == 1) == (padded['labels'] >= 0)).all()
  spans = sorted(
    padded['labels'][r, a:b].tolist() for r, a, b in packing_lib.spans(padded['segment_ids'])
  )
  assert spans == sorted(
    packed['labels'][r, a:b].tolist() for r, a, b in packing_lib.spans(packed['segment_ids'])
  )
  assert len(full['inputs']) and (full['segment_ids'] == 1).all() and (full['labels'] >= 0).all()


def test_a_case_is_a_pattern_and_its_options():
  assert packing.parse_case('gated_deltanet:implementation=pallas:chunk_size=16') == (
    'gated_deltanet',
    {'implementation': 'pallas', 'chunk_size': 16},
  )
  assert packing.parse_case('linear+local') == ('linear+local', {})
  with pytest.raises(ValueError, match="option 'window' is not key=value"):
    packing.parse_case('local:window')


def _tiny_run(tmp_path, cases):
  corpus = tmp_path / 'corpus.txt'
  corpus.write_bytes(b'\n\n'.join(DOCS))
  out = str(tmp_path / 'out')
  result = packing.main(
    [
      f'--cases={cases}',
      f'--corpus={corpus}',
      f'--seq_len={L}',
      '--batch=3',
      '--d_model=8',
      '--depth=1',
      '--num_heads=2',
      '--repeats=1',
      '--budget_s=5',
      f'--out={out}',
      '--quiet',
    ]
  )
  with open(os.path.join(out, 'packing.json')) as f:
    assert json.load(f)['cases'].keys() == result['cases'].keys()
  with open(os.path.join(out, 'packing.md')) as f:
    return result, f.read()


@pytest.mark.slow
def test_a_mechanism_without_segments_is_timed_padded_and_its_refusal_recorded(tmp_path):
  unable = registry.names_where(lambda m: m.causal and not m.segments)
  if 'linear' not in unable:
    pytest.skip('linear keeps packed documents apart')
  result, text = _tiny_run(tmp_path, 'linear')
  m = result['cases']['linear']
  assert m['padded']['tokens_per_s'] > 0 and m['full']['tokens_per_s'] > 0
  assert m['padded']['real_tokens'] <= 3 * L
  for key in ('packed', 'full_segments'):
    assert m[key]['refused'].startswith(
      "segment_ids (packed rows): mechanism 'linear' cannot keep packed documents apart"
    ), m[key]
  assert '| linear |' in text and 'refused (no segments)' in text
  assert 'command: `python -m benchmarks.packing --cases=linear' in text
  assert f'{result["windows"]} windows of at most {L} bytes' in text


@pytest.mark.slow
def test_a_mechanism_with_segments_gets_its_packed_rate(tmp_path):
  able = registry.names_where(lambda m: m.causal and m.segments)
  if not able:
    pytest.skip('no mechanism keeps packed documents apart yet')
  result, text = _tiny_run(tmp_path, able[0])
  m = result['cases'][able[0]]
  assert m['packed']['real_tokens'] > m['padded']['real_tokens']  # more real bytes a row
  assert np.isfinite(m['packed']['tokens_per_s']) and m['full_segments']['time_s'] > 0
  assert 'refused' not in text

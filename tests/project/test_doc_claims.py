"""The guides' statements about the code's status agree with the code (issue 70, item 4).

A guide said a Pallas kernel "was not attempted" after the kernels existed, and that an
offline run failed after minutes when it failed in seconds. Each claim below pairs a
sentence the guides make with the fact in the code that makes it true: when the fact
changes, the test names the sentence to rewrite (and a sentence written back after it
stopped being true fails too).
"""

import glob
import os
import re

from efficient_attn.ops import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDES = ['README.md', *sorted(glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True))]


def _text(path):
  with open(os.path.join(ROOT, path)) as f:
    return ' '.join(f.read().split())  # sentences wrap across lines


def _saying(pattern):
  return [
    os.path.relpath(os.path.join(ROOT, p), ROOT) for p in GUIDES if re.search(pattern, _text(p))
  ]


def test_no_guide_says_the_kernels_were_not_attempted():
  assert os.path.isdir(os.path.join(ROOT, 'efficient_attn', 'ops', 'kernels'))
  assert not _saying(r'Pallas (chunk )?kernel was not (attempted|within reach)'), (
    'the Pallas kernels exist (efficient_attn/ops/kernels/)'
  )


def test_the_guides_say_auto_is_xla_exactly_while_no_platform_takes_a_kernel():
  """README.md and docs/design.md say that the kernels have not run on a GPU or TPU and that
  'auto' is XLA; `kernels.AUTO` (the platforms where 'auto' takes a kernel, filled from a
  measurement) decides whether that is still true."""
  claim = r"never on a GPU or (a )?TPU, so \W*auto\W* (picks the XLA forms|is \W*xla\W* everywhere)"
  saying = _saying(claim)
  if kernels.AUTO:
    assert not saying, f"'auto' takes a kernel on {sorted(kernels.AUTO)}: rewrite {saying}"
  else:
    assert {'README.md', 'docs/design.md'} <= set(saying), saying


def test_the_offline_failure_is_not_said_to_take_minutes():
  """`data.DownloadError` is raised at TFDS's first failed connection (tests/data/ check
  the one line), in seconds; the guides said 'about three and a half minutes'."""
  assert not _saying(r'(three and a half|\b3\.5) minutes'), 'an offline run stops in seconds'

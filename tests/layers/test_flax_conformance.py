"""flax's own attention test files pass with our layers in place of flax's.

The files are read from the installed flax version's source distribution (see
`tests/flax_conformance.py`); none of their code is copied here. Our own tests
cover the same behaviours in our words (test_attention.py, test_nnx.py,
test_decode.py); this is the drop-in promise checked against flax's wording.
"""

import flax_conformance
import pytest


@pytest.mark.slow
@pytest.mark.parametrize('suite', sorted(flax_conformance.SUITES))
def test_flax_attention_tests_pass_with_our_layer(suite):
  done = flax_conformance.run(suite, ['-x', '--tb=short', '-W', 'ignore::DeprecationWarning'])
  assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
  assert ' passed' in done.stdout and 'failed' not in done.stdout
